// A group of one rank, in host memory: every collective is a copy or nothing. Used where a
// collective library would add nothing (size 1), so it needs none.
#pragma once

#include <memory>

#include "parallel/communicator.h"

namespace hyserve::parallel {

std::unique_ptr<Communicator> make_single_rank_communicator();

}  // namespace hyserve::parallel
