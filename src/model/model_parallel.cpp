// Model's tensor-parallel pieces (model/tensor_parallel.h): the vocab-split embedding and
// lm_head, and the sum of each layer's partial results over the group. Member functions of
// Model (model.h), kept apart from the decoder's sequence of layers in model.cpp.
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"

namespace hyserve {

void Model::embed(Pass& pass, const int32_t* ids, int64_t t, float* h) const {
  EmbeddingParams p;
  p.table = &weights_.embed;
  p.ids = ids;
  p.out = h;
  p.num_tokens = t;
  p.first_id = vocab_.first;
  p.vocab_size = full_config_.vocab_size;
  backend_->embedding_lookup(p);
  tp_reduce(pass, h, t * config_.hidden_size);
}

void Model::lm_head(Pass& pass, const float* x, int64_t rows, float* logits) const {
  const TensorParallel& tp = options_.parallel.tp;
  if (tp.size == 1) {
    linear_into(x, rows, weights_.lm_head, logits);
    return;
  }
  // Each rank's logits [rows, shard_r] (row stride shard_r) lead a block of rows * stride
  // floats, the same size on every rank; rank r's go to columns [r * stride, + shard_r):
  //
  //   gathered     | rank 0: [rows, stride] | ... | rank N-1: [rows, shard_N-1], padding |
  //   logits row i | rank 0's row i         | ... | rank N-1's row i |   (V columns)
  const int64_t vocab = full_config_.vocab_size;
  const int64_t block = rows * vocab_.stride;
  const Workspace::Mark mark = pass.ws.mark();
  float* part = pass.ws.floats(block);
  float* all = pass.ws.floats(block * tp.size);
  linear_into(x, rows, weights_.lm_head, part);
  tp.comm->all_gather(part, all, static_cast<size_t>(block) * 4);
  for (int r = 0; r < tp.size; ++r) {
    const VocabShard v = vocab_shard(vocab, r, tp.size);
    backend_->copy_2d({logits + v.first, vocab, all + r * block, v.rows, rows, v.rows});
  }
  pass.ws.rewind(mark);
}

void Model::tp_reduce(Pass& pass, float* data, int64_t n) const {
  const TensorParallel& tp = options_.parallel.tp;
  if (tp.size == 1 || n == 0) return;
  if (!options_.batch_invariant) {
    tp.comm->all_reduce(data, n);
    return;
  }
  // A fixed order whatever n is: ((p0 + p1) + p2) + ...
  const Workspace::Mark mark = pass.ws.mark();
  float* all = pass.ws.floats(n * tp.size);
  tp.comm->all_gather(data, all, static_cast<size_t>(n) * 4);
  backend_->copy(data, all, static_cast<size_t>(n) * 4);
  for (int r = 1; r < tp.size; ++r) backend_->residual_add({data, all + r * n, n});
  pass.ws.rewind(mark);
}

}  // namespace hyserve
