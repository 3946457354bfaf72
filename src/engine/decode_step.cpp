#include "engine/decode_step.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/dcp_position.h"
#include "core/paged.h"
#include "util/error.h"

namespace hyserve {
namespace {

// Graph ids are unique in the process: several runners may share one backend.
int64_t next_graph_id() {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1);
}

// The per-token inputs of a step of `rows` rows, at offsets that depend on rows only (a
// graph of that many rows reads them there): pos, slots (int64), ids, seq_lens, state rows,
// the rows of ids taken from a device token array, the LoRA adapter slots (int32).
struct InputLayout {
  int64_t pos, slots, ids, seq_lens, state_rows, sources, lora, bytes;
};
InputLayout input_layout(int64_t rows) {
  return {0, 8 * rows, 16 * rows, 20 * rows, 24 * rows, 28 * rows, 32 * rows, 36 * rows};
}

// A verification's inputs for up to `tokens` tokens of up to `seqs` sequences: per token
// pos, slots (int64), ids, seq_lens, LoRA adapter slots (int32); per sequence state rows,
// token offsets (one more) and the commit's counts (int32).
struct VerifyLayout {
  int64_t pos, slots, ids, seq_lens, lora, state_rows, offsets, counts, bytes;
};
VerifyLayout verify_layout(int64_t tokens, int64_t seqs) {
  const int64_t state_rows = 28 * tokens;
  const int64_t offsets = state_rows + 4 * seqs;
  const int64_t counts = offsets + 4 * (seqs + 1);
  return {0,          8 * tokens, 16 * tokens, 20 * tokens,      24 * tokens,
          state_rows, offsets,    counts,      counts + 4 * seqs};
}

// Releases and forgets the graphs with LoRA ops (a key whose last part, the LoRA key, is
// not 0).
template <class Graphs>
void release_lora_graphs(Graphs& graphs, Backend& backend) {
  constexpr size_t kLora = std::tuple_size_v<typename Graphs::key_type> - 1;
  for (auto it = graphs.begin(); it != graphs.end();) {
    if (std::get<kLora>(it->first) != 0) {
      backend.release_graph(it->second.id);
      it = graphs.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

DecodeStep::DecodeStep(const Model& model, KvCache& cache, Workspace& ws, DecodeStepConfig config)
    : model_(model), backend_(model.backend()), cache_(cache), ws_(ws), config_(config) {
  CHECK(config_.max_batch >= 1 && config_.max_context >= 1 && config_.graph_max_batch >= 0,
        "decode step: max_batch ", config_.max_batch, ", max_context ", config_.max_context,
        ", graph_max_batch ", config_.graph_max_batch);
  config_.graph_max_batch = std::min(config_.graph_max_batch, config_.max_batch);
  if (!model_.decode_capturable()) config_.graph_max_batch = 0;
  CHECK(config_.max_verify_tokens >= 0, "decode step: max_verify_tokens ",
        config_.max_verify_tokens);
  width_ = cache_.plan().blocks_for_tokens(config_.max_context);
  pad_ = cache_.scratch_block();
  const auto rows = static_cast<size_t>(config_.max_batch);
  // A verification's tokens each take a table row too.
  const auto table_rows = std::max(rows, static_cast<size_t>(config_.max_verify_tokens));
  tables_ = DeviceAllocation(&backend_, table_rows * static_cast<size_t>(width_) * 4);
  inputs_ = DeviceAllocation(&backend_, static_cast<size_t>(input_layout(config_.max_batch).bytes));
  logits_ = DeviceAllocation(&backend_, rows * static_cast<size_t>(model_.config().vocab_size) * 4);
  table_host_.assign(table_rows * static_cast<size_t>(width_), pad_);
  backend_.upload(tables_.data(), table_host_.data(), table_host_.size() * 4);
  row_used_.assign(table_rows, 0);
  staging_.resize(inputs_.size());
  if (config_.max_verify_tokens > 0) {
    const VerifyLayout l = verify_layout(config_.max_verify_tokens, config_.max_batch + 1);
    verify_inputs_ = DeviceAllocation(&backend_, static_cast<size_t>(l.bytes));
    staging_.resize(std::max(staging_.size(), static_cast<size_t>(l.bytes)));
    if (config_.graph_max_batch > 0 && backend_.supports_graphs()) {
      // A graph writes its logits at fixed addresses.
      verify_logits_ =
          DeviceAllocation(&backend_, static_cast<size_t>(config_.max_verify_tokens) *
                                          static_cast<size_t>(model_.config().vocab_size) * 4);
    }
    const int64_t floats = model_.kda_stash_floats(config_.max_verify_tokens);
    if (floats > 0) {
      stash_buffer_ = DeviceAllocation(&backend_, static_cast<size_t>(floats) * 4);
      stash_ = {stash_buffer_.as<float>(), config_.max_verify_tokens};
    }
  }
}

DecodeStep::~DecodeStep() {
  for (const auto& [shape, g] : graphs_) backend_.release_graph(g.id);
  for (const auto& [shape, g] : verify_graphs_) backend_.release_graph(g.id);
}

int64_t DecodeStep::device_bytes(int64_t vocab, int64_t max_batch, int64_t table_width) {
  return max_batch * (table_width * 4 + input_layout(1).bytes + vocab * 4);
}

int64_t DecodeStep::verify_bytes(const Model& model, int64_t max_batch, int64_t max_verify_tokens,
                                 int64_t table_width) {
  if (max_verify_tokens <= 0) return 0;
  return std::max<int64_t>(0, max_verify_tokens - max_batch) * table_width * 4 +
         verify_layout(max_verify_tokens, max_batch + 1).bytes +
         model.kda_stash_floats(max_verify_tokens) * 4 +
         max_verify_tokens * model.config().vocab_size * 4;  // the graphs' logits
}

void DecodeStep::release_graphs() {
  for (const auto& [shape, g] : graphs_) backend_.release_graph(g.id);
  for (const auto& [shape, g] : verify_graphs_) backend_.release_graph(g.id);
  graphs_.clear();
  verify_graphs_.clear();
}

int64_t DecodeStep::num_graphs() const {
  int64_t n = 0;
  for (const auto& [shape, g] : graphs_) n += g.captured ? 1 : 0;
  for (const auto& [shape, g] : verify_graphs_) n += g.captured ? 1 : 0;
  return n;
}

bool DecodeStep::accepts(std::span<const SequenceInput> batch) const {
  if (batch.empty() || std::ssize(batch) > config_.max_batch || batch[0].cache != &cache_ ||
      !model_.is_batched_decode(batch)) {
    return false;
  }
  return std::all_of(batch.begin(), batch.end(), [&](const SequenceInput& in) {
    return in.num_computed + 1 <= config_.max_context && std::ssize(in.blocks) <= width_;
  });
}

void DecodeStep::set_table_row(int64_t row, std::span<const int32_t> blocks) {
  int32_t* host = table_host_.data() + row * width_;
  const int64_t n = std::ssize(blocks);
  const int64_t used = row_used_[static_cast<size_t>(row)];
  // The entries that differ: from the first mismatch to the end of what either holds.
  int64_t first = 0;
  const int64_t common = std::min(n, used);
  if (common > 0 && std::memcmp(host, blocks.data(), static_cast<size_t>(common) * 4) != 0) {
    while (host[first] == blocks[static_cast<size_t>(first)]) ++first;
  } else {
    first = common;
  }
  const int64_t end = std::max(n, used);
  if (first == end) return;
  for (int64_t j = first; j < end; ++j) {
    const int32_t b = j < n ? blocks[static_cast<size_t>(j)] : pad_;
    CHECK(j >= n || (b >= 0 && b < pad_), "decode step: block ", b, " outside the pool of ", pad_);
    host[j] = b;
  }
  backend_.upload(tables_.as<int32_t>() + row * width_ + first, host + first,
                  static_cast<size_t>(end - first) * 4);
  row_used_[static_cast<size_t>(row)] = n;
  table_entries_uploaded_ += end - first;
  bytes_uploaded_ += (end - first) * 4;
}

void DecodeStep::replay_or_capture(Graph& g, const std::function<void()>& step) {
  if (g.id == 0) g.id = next_graph_id();
  if (g.captured && g.pool == cache_.base()) {
    backend_.replay_graph(g.id);
    return;
  }
  step();  // this step's result; then the same ops are recorded
  backend_.capture_graph(g.id, step);
  g.pool = cache_.base();
  g.captured = true;
}

int64_t DecodeStep::check_row(const SequenceInput& in, int64_t i, int64_t j) const {
  const int64_t bs = cache_.plan().block_size, dcp = cache_.plan().options.dcp;
  const int64_t position = in.num_computed + j;
  CHECK(in.num_computed >= 0 && std::ssize(in.blocks) * bs * dcp > position,
        "decode step: ", in.blocks.size(), " blocks cannot hold position ", position,
        " of sequence ", i);
  CHECK(cache_.plan().kda_state_rows == 0 || (in.state_block >= 0 && in.state_block < pad_),
        "decode step: KDA state block ", in.state_block, " of sequence ", i, " outside the pool");
  return in.slots.empty() ? slot_index(in.blocks.data(), bs, dcp_local_slot(position, dcp))
                          : in.slots[static_cast<size_t>(j)];
}

DecodeStep::LoraMode DecodeStep::lora_mode(std::span<const SequenceInput> batch) {
  if (!model_.lora_applies(batch)) return LoraMode::kNone;
  for (const SequenceInput& in : batch) {
    if (model_.lora_merges(in.lora_slot)) return LoraMode::kSplit;
  }
  // Graphs with LoRA ops launch those of the projections adapted when they were captured:
  // another layout (a projection gained or lost its last adapter) captures them again.
  const int64_t generation = model_.lora_generation();
  if (generation != lora_generation_) {
    release_lora_graphs(graphs_, backend_);
    release_lora_graphs(verify_graphs_, backend_);
    lora_generation_ = generation;
  }
  return LoraMode::kSlots;
}

int64_t DecodeStep::graph_lora_key(LoraMode mode) const {
  return mode == LoraMode::kSlots ? 1 + lora_generation_ : 0;
}

bool DecodeStep::accepts_verify(std::span<const SequenceInput> batch) const {
  if (config_.max_verify_tokens == 0 || batch.empty() || std::ssize(batch) > config_.max_batch) {
    return false;
  }
  int64_t tokens = 0;
  for (const SequenceInput& in : batch) {
    if (in.cache != &cache_ || in.tokens.empty() ||
        in.num_computed + std::ssize(in.tokens) > config_.max_context ||
        std::ssize(in.blocks) > width_ ||
        (!in.slots.empty() && in.slots.size() != in.tokens.size())) {
      return false;
    }
    tokens += std::ssize(in.tokens);
  }
  return tokens <= config_.max_verify_tokens;
}

const float* DecodeStep::verify(std::span<const SequenceInput> batch) {
  CHECK(accepts_verify(batch), "decode step: the batch is not a verification of this cache ",
        "within ", config_.max_batch, " sequences and ", config_.max_verify_tokens, " tokens");
  bytes_uploaded_ = 0;
  table_entries_uploaded_ = 0;
  const int64_t vocab = model_.config().vocab_size;
  const auto num_seqs = std::ssize(batch);
  int64_t num_tokens = 0, max_keys = 0;
  for (const SequenceInput& in : batch) {
    num_tokens += std::ssize(in.tokens);
    max_keys = std::max<int64_t>(max_keys, in.num_computed + std::ssize(in.tokens));
  }
  // LoRA adapters: each token's slot in the inputs (a graph replays them); a batch with a
  // merged kv_b (its sequences attend with their own weights) is cut into per-sequence
  // slices and runs eagerly.
  const LoraMode lora = lora_mode(batch);
  // The shape: the graph bucket (rows, tokens, context), or the batch itself.
  const bool graph = lora != LoraMode::kSplit && verify_logits_.data() != nullptr &&
                     num_seqs <= config_.graph_max_batch;
  int64_t rows = num_seqs, tokens = num_tokens, context = max_keys;
  if (graph) {
    tokens = 1;
    while (tokens < num_tokens) tokens *= 2;
    tokens = std::min(tokens, config_.max_verify_tokens);
    const int64_t needed = num_seqs + (tokens > num_tokens ? 1 : 0);
    rows = 1;
    while (rows < needed) rows *= 2;
    rows = std::min(rows, config_.graph_max_batch + 1);
    context = 4096;
    while (context < max_keys) context *= 2;
    context = std::min(context, config_.max_context);
  }
  const VerifyLayout l = verify_layout(config_.max_verify_tokens, config_.max_batch + 1);
  auto* pos = reinterpret_cast<int64_t*>(staging_.data() + l.pos);
  auto* slots = reinterpret_cast<int64_t*>(staging_.data() + l.slots);
  auto* ids = reinterpret_cast<int32_t*>(staging_.data() + l.ids);
  auto* seq_lens = reinterpret_cast<int32_t*>(staging_.data() + l.seq_lens);
  auto* state_rows = reinterpret_cast<int32_t*>(staging_.data() + l.state_rows);
  auto* offsets = reinterpret_cast<int32_t*>(staging_.data() + l.offsets);
  auto* lora_slots = reinterpret_cast<int32_t*>(staging_.data() + l.lora);
  int64_t row = 0;
  verify_lengths_.clear();
  for (int64_t i = 0; i < num_seqs; ++i) {
    const SequenceInput& in = batch[static_cast<size_t>(i)];
    offsets[i] = static_cast<int32_t>(row);
    state_rows[i] = in.state_block >= 0 ? in.state_block : pad_;
    verify_lengths_.push_back(static_cast<int32_t>(in.tokens.size()));
    for (int64_t j = 0; j < std::ssize(in.tokens); ++j, ++row) {
      const int32_t id = in.tokens[static_cast<size_t>(j)];
      CHECK(id >= 0 && id < vocab, "decode step: token id ", id, " of sequence ", i,
            " is outside the vocabulary [0, ", vocab, ")");
      slots[row] = check_row(in, i, j);
      set_table_row(row, in.blocks);
      pos[row] = in.num_computed + j;
      ids[row] = id;
      seq_lens[row] = static_cast<int32_t>(in.num_computed + j + 1);
      lora_slots[row] = in.lora_slot;
    }
  }
  // Padding: tokens past the batch's (the last padding row's run), rows past its sequences.
  for (; row < tokens; ++row) {
    set_table_row(row, {});
    pos[row] = 0;
    slots[row] = -1;
    ids[row] = 0;
    seq_lens[row] = 1;
    lora_slots[row] = -1;
  }
  for (int64_t i = num_seqs; i < rows; ++i) {
    offsets[i] = static_cast<int32_t>(num_tokens);
    state_rows[i] = pad_;
  }
  offsets[rows] = static_cast<int32_t>(tokens);
  // Only the parts in use: the per-token arrays of `tokens` tokens and the rows' arrays.
  uint8_t* base = verify_inputs_.as<uint8_t>();
  const std::pair<int64_t, int64_t> parts[] = {{l.pos, 8 * tokens},        {l.slots, 8 * tokens},
                                               {l.ids, 4 * tokens},        {l.seq_lens, 4 * tokens},
                                               {l.lora, 4 * tokens},       {l.state_rows, 4 * rows},
                                               {l.offsets, 4 * (rows + 1)}};
  for (const auto& [at, bytes] : parts) {
    backend_.upload(base + at, staging_.data() + at, static_cast<size_t>(bytes));
    bytes_uploaded_ += bytes;
  }
  verify_sequences_ = num_seqs;
  verify_tokens_ = num_tokens;

  const SequenceSlice all{0, tokens, 0, &cache_, tables_.as<int32_t>(), pad_, true};
  std::vector<SequenceSlice> per_sequence;
  if (lora == LoraMode::kSplit) {
    for (int64_t i = 0; i < num_seqs; ++i) {
      const SequenceInput& in = batch[static_cast<size_t>(i)];
      per_sequence.push_back({offsets[i], std::ssize(in.tokens), 0, &cache_, tables_.as<int32_t>(),
                              pad_, true, in.lora_slot});
    }
  }
  BatchedDecode decode{&cache_,
                       tables_.as<int32_t>(),
                       width_,
                       reinterpret_cast<const int32_t*>(base + l.state_rows),
                       reinterpret_cast<const int32_t*>(base + l.seq_lens),
                       context};
  decode.token_offsets = reinterpret_cast<const int32_t*>(base + l.offsets);
  decode.num_sequences = rows;
  decode.kda_stash = stash_.data != nullptr ? &stash_ : nullptr;
  const DeviceBatch db{
      reinterpret_cast<const int32_t*>(base + l.ids),
      reinterpret_cast<const int64_t*>(base + l.pos),
      reinterpret_cast<const int64_t*>(base + l.slots),
      tokens,
      lora == LoraMode::kSplit ? std::span<const SequenceSlice>(per_sequence)
                               : std::span<const SequenceSlice>(&all, 1),
      decode,
      lora == LoraMode::kSlots ? reinterpret_cast<const int32_t*>(base + l.lora) : nullptr};
  float* out = graph ? verify_logits_.as<float>() : nullptr;
  const float* logits = nullptr;
  auto step = [&] {
    ws_.reset();
    logits = model_.forward_device(db, ws_, out);
  };
  if (!graph) {
    step();
    return logits;
  }
  replay_or_capture(verify_graphs_[{rows, tokens, context, graph_lora_key(lora)}], step);
  return out;
}

void DecodeStep::commit(std::span<const int32_t> counts) {
  CHECK(std::ssize(counts) == verify_sequences_, "decode step: ", counts.size(),
        " commit counts for the last verification's ", verify_sequences_, " sequences");
  for (size_t i = 0; i < counts.size(); ++i) {
    CHECK(counts[i] >= 1 && counts[i] <= verify_lengths_[i], "decode step: commit of ", counts[i],
          " tokens of sequence ", i, " which verified ", verify_lengths_[i]);
  }
  if (stash_.data == nullptr || counts.empty()) return;
  const VerifyLayout l = verify_layout(config_.max_verify_tokens, config_.max_batch + 1);
  uint8_t* base = verify_inputs_.as<uint8_t>();
  backend_.upload(base + l.counts, counts.data(), counts.size() * 4);
  KdaCommit c;
  c.cache = &cache_;
  c.stash = &stash_;
  c.state_rows = reinterpret_cast<const int32_t*>(base + l.state_rows);
  c.token_offsets = reinterpret_cast<const int32_t*>(base + l.offsets);
  c.token_counts = reinterpret_cast<const int32_t*>(base + l.counts);
  c.num_sequences = verify_sequences_;
  c.num_tokens = verify_tokens_;
  model_.commit_kda(c);
}

const float* DecodeStep::run(std::span<const SequenceInput> batch, const TokenSource& source) {
  CHECK(accepts(batch), "decode step: the batch is not a batched decode of this cache within ",
        config_.max_batch, " sequences of ", config_.max_context, " tokens");
  bytes_uploaded_ = 0;
  table_entries_uploaded_ = 0;
  const auto num_seqs = std::ssize(batch);
  const int64_t vocab = model_.config().vocab_size;
  int64_t max_keys = 0;
  for (const SequenceInput& in : batch) max_keys = std::max(max_keys, in.num_computed + 1);

  // LoRA adapters: each row's slot in the inputs (a graph replays them); a batch with a
  // merged kv_b (its sequences attend with their own weights) runs eagerly, one slice per
  // sequence.
  const LoraMode lora = lora_mode(batch);
  // The shape: the graph bucket, or the batch itself when it runs eagerly.
  const bool graph = lora != LoraMode::kSplit && config_.graph_max_batch > 0 &&
                     backend_.supports_graphs() && num_seqs <= config_.graph_max_batch;
  int64_t rows = num_seqs, context = max_keys;
  if (graph) {
    rows = 1;
    while (rows < num_seqs) rows *= 2;
    rows = std::min(rows, config_.graph_max_batch);
    context = 4096;
    while (context < max_keys) context *= 2;
    context = std::min(context, config_.max_context);
  }

  // The inputs: table rows where they changed, the per-token arrays in one copy. Padding
  // rows: token 0 at position 0, no cache write, one key in the scratch block.
  const InputLayout l = input_layout(rows);
  auto* pos = reinterpret_cast<int64_t*>(staging_.data() + l.pos);
  auto* slots = reinterpret_cast<int64_t*>(staging_.data() + l.slots);
  auto* ids = reinterpret_cast<int32_t*>(staging_.data() + l.ids);
  auto* seq_lens = reinterpret_cast<int32_t*>(staging_.data() + l.seq_lens);
  auto* state_rows = reinterpret_cast<int32_t*>(staging_.data() + l.state_rows);
  auto* sources = reinterpret_cast<int32_t*>(staging_.data() + l.sources);
  auto* lora_slots = reinterpret_cast<int32_t*>(staging_.data() + l.lora);
  CHECK(source.rows.empty() || std::ssize(source.rows) == num_seqs,
        "decode step: ", source.rows.size(), " token source rows for ", num_seqs, " sequences");
  bool gather = false;
  // One block id covers block_size * dcp positions (core/dcp_position.h).
  const int64_t bs = cache_.plan().block_size, dcp = cache_.plan().options.dcp;
  const bool has_state = cache_.plan().kda_state_rows > 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (i >= num_seqs) {
      set_table_row(i, {});
      pos[i] = 0;
      slots[i] = -1;
      ids[i] = 0;
      seq_lens[i] = 1;
      state_rows[i] = pad_;
      sources[i] = -1;
      lora_slots[i] = -1;
      continue;
    }
    const SequenceInput& in = batch[static_cast<size_t>(i)];
    sources[i] = source.rows.empty() ? -1 : source.rows[static_cast<size_t>(i)];
    CHECK(sources[i] < 0 || source.tokens != nullptr, "decode step: no token source for row ", i);
    CHECK(sources[i] >= 0 || (in.tokens[0] >= 0 && in.tokens[0] < vocab), "decode step: token id ",
          in.tokens[0], " of sequence ", i, " is outside the vocabulary [0, ", vocab, ")");
    gather = gather || sources[i] >= 0;
    CHECK(in.num_computed >= 0 && std::ssize(in.blocks) * bs * dcp > in.num_computed,
          "decode step: ", in.blocks.size(), " blocks cannot hold position ", in.num_computed,
          " of sequence ", i);
    CHECK(!has_state || (in.state_block >= 0 && in.state_block < pad_), "decode step: KDA state ",
          "block ", in.state_block, " of sequence ", i, " outside the pool");
    set_table_row(i, in.blocks);
    pos[i] = in.num_computed;
    slots[i] = in.slots.empty()
                   ? slot_index(in.blocks.data(), bs, dcp_local_slot(in.num_computed, dcp))
                   : in.slots[0];
    ids[i] = sources[i] >= 0 ? 0 : in.tokens[0];
    seq_lens[i] = static_cast<int32_t>(in.num_computed + 1);
    state_rows[i] = in.state_block >= 0 ? in.state_block : pad_;
    lora_slots[i] = in.lora_slot;
  }
  backend_.upload(inputs_.data(), staging_.data(), static_cast<size_t>(l.bytes));
  bytes_uploaded_ += l.bytes;

  uint8_t* base = inputs_.as<uint8_t>();
  if (gather) {
    backend_.gather_tokens({reinterpret_cast<int32_t*>(base + l.ids), source.tokens,
                            reinterpret_cast<const int32_t*>(base + l.sources), num_seqs});
  }
  const SequenceSlice all{0, rows, 0, &cache_, tables_.as<int32_t>(), pad_, true};
  std::vector<SequenceSlice> per_sequence;
  if (lora == LoraMode::kSplit) {
    for (int64_t i = 0; i < num_seqs; ++i) {
      per_sequence.push_back({i, 1, 0, &cache_, tables_.as<int32_t>(), pad_, true,
                              batch[static_cast<size_t>(i)].lora_slot});
    }
  }
  const DeviceBatch db{
      reinterpret_cast<const int32_t*>(base + l.ids),
      reinterpret_cast<const int64_t*>(base + l.pos),
      reinterpret_cast<const int64_t*>(base + l.slots),
      rows,
      lora == LoraMode::kSplit ? std::span<const SequenceSlice>(per_sequence)
                               : std::span<const SequenceSlice>(&all, 1),
      {&cache_, tables_.as<int32_t>(), width_,
       reinterpret_cast<const int32_t*>(base + l.state_rows),
       reinterpret_cast<const int32_t*>(base + l.seq_lens), context},
      lora == LoraMode::kSlots ? reinterpret_cast<const int32_t*>(base + l.lora) : nullptr};
  auto step = [&] {
    ws_.reset();
    model_.forward_device(db, ws_, logits_.as<float>());
  };
  if (!graph) {
    step();
    return logits_.as<float>();
  }
  replay_or_capture(graphs_[{rows, context, graph_lora_key(lora)}], step);
  return logits_.as<float>();
}

}  // namespace hyserve
