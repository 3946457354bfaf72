#include "parallel/parallel_layout.h"

#include "parallel/communicator.h"
#include "util/error.h"

namespace hyserve::parallel {

void ParallelLayout::check_sizes(int64_t tp_size, int64_t dcp_size, std::string_view tp_name,
                                 std::string_view dcp_name) {
  // A configuration error, for the user: the message alone (no source location).
  if (tp_size < 1) throw InvalidArgument(str_cat(tp_name, " must be at least 1, got ", tp_size));
  if (dcp_size < 1 || tp_size % dcp_size != 0) {
    throw InvalidArgument(str_cat(dcp_name, " ", dcp_size, " must divide ", tp_name, " ", tp_size,
                                  " (DCP groups are made of the TP group's ranks, as in vLLM)"));
  }
}

ParallelLayout ParallelLayout::make(int tp_rank, int tp_size, int dcp_size, bool expert_parallel) {
  check_sizes(tp_size, dcp_size);
  ParallelLayout l;
  l.tp = {tp_rank, tp_size, nullptr};
  l.dcp = {tp_rank % dcp_size, dcp_size, nullptr};
  l.expert_parallel = expert_parallel;
  CHECK(tp_rank >= 0 && tp_rank < tp_size, "tensor-parallel rank ", tp_rank, " of ", tp_size);
  return l;
}

void ParallelLayout::validate() const {
  check_sizes(tp.size, dcp.size);
  CHECK(tp.rank >= 0 && tp.rank < tp.size, "tensor-parallel rank ", tp.rank, " of ", tp.size);
  CHECK(tp.size == 1 ||
            (tp.comm != nullptr && tp.comm->size() == tp.size && tp.comm->rank() == tp.rank),
        "tensor parallelism: rank ", tp.rank, " of ", tp.size, " needs its group's communicator");
  CHECK(dcp.rank == tp.rank % dcp.size, "decode context parallelism: rank ", dcp.rank, " of ",
        dcp.size, " is not tp rank ", tp.rank, " % ", dcp.size);
  CHECK(dcp.size == 1 ||
            (dcp.comm != nullptr && dcp.comm->size() == dcp.size && dcp.comm->rank() == dcp.rank),
        "decode context parallelism: rank ", dcp.rank, " of ", dcp.size,
        " needs its group's communicator (tp rank ", tp.rank, " of ", tp.size, ")");
}

}  // namespace hyserve::parallel
