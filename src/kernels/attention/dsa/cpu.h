// CPU reference of DSA decode over the packed block cache (params.h): fp32 math, one
// plain loop nest per op, reading the same packed bytes as the CUDA kernels. Pointers
// are host pointers (the pool too).
#pragma once

#include "kernels/attention/dsa/params.h"

namespace hyserve::cpu {

// score[b, i, p] for p < seq_lens[b]: visible keys scored, later ones -inf.
void dsa_indexer_scores(const DsaIndexerParams& p);

// Per (b, i): the min(topk, position + 1) highest scores among positions 0..position,
// ties to the lower position, ascending position order, padded with -1. Throws on a
// visible NaN score.
void dsa_topk(const DsaTopkParams& p);

// Sparse (p.slots set: the listed slots, in list order) or dense (positions 0..position
// in order) MLA decode; o_lat and lse.
void dsa_mla_decode(const DsaMlaParams& p);

// indexer -> top-k -> sparse MLA, with its own scratch.
void dsa_decode(const DsaDecodeParams& p);

}  // namespace hyserve::cpu
