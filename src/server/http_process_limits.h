// What the HTTP server asks of the process before it listens: enough open-file descriptors
// for its connections, and how many I/O threads to run.
#pragma once

namespace hyserve {

// Raises RLIMIT_NOFILE's soft limit to the hard limit (each connection is a descriptor);
// logs once when that is still below max_connections.
void raise_open_file_limit(int max_connections);

// `requested` when positive, else hardware_concurrency clamped to [2, 4].
int resolve_num_io_threads(int requested);

}  // namespace hyserve
