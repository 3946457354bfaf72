// Engine generation control (issue 48 item 4): pause / resume, sleep / wake-up, prefix-cache
// reset and weight updates, each a Control run on the engine thread between steps.
// docs/DECISIONS.md "Weight updates and sleep mode".
#include <algorithm>
#include <chrono>
#include <exception>
#include <future>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/weight_transfer.h"
#include "model/checkpoint.h"
#include "model/tensor_source.h"
#include "util/error.h"
#include "util/log.h"

namespace hyserve {

PauseMode parse_pause_mode(std::string_view name, const std::string& field) {
  if (name == "abort") return PauseMode::kAbort;
  if (name == "wait") return PauseMode::kWait;
  if (name == "keep") return PauseMode::kKeep;
  throw InvalidRequest(field, std::string(field) +
                                  " must be one of 'abort', 'wait', 'keep', got '" +
                                  std::string(name) + "'");
}

void Engine::Impl::settle(std::vector<Delivery>& out) {
  if (!in_flight) return;
  finish_step(*in_flight, out);
  in_flight.reset();
}

void Engine::Impl::release_held() {
  std::lock_guard lock(mu);
  incoming.insert(incoming.begin(), std::make_move_iterator(held.begin()),
                  std::make_move_iterator(held.end()));
  held.clear();
}

bool Engine::Impl::drain(PauseMode mode, bool& started) {
  if (!started) {
    started = true;
    admission_closed = true;  // what arrives from now on waits for the end of the pause
    if (mode == PauseMode::kAbort) abort_all(control_out, "abort", false);
  }
  return mode != PauseMode::kWait || !scheduler.has_unfinished_requests();
}

void Engine::Impl::reopen() {
  paused = false;
  admission_closed = false;
  paused_by_sleep = false;
  release_held();
}

bool Engine::Impl::run_controls(std::vector<Delivery>& out) {
  Control* c = nullptr;
  {
    std::lock_guard lock(mu);
    if (controls.empty()) return false;
    c = &controls.front();  // deque: stays put while others are queued behind it
  }
  apply_incoming(out);
  settle(out);
  bool finished = true;
  std::exception_ptr error;
  try {
    finished = c->fn();
  } catch (...) {
    error = std::current_exception();
  }
  for (Delivery& d : control_out) out.push_back(std::move(d));
  control_out.clear();
  if (error || finished) {
    answers.push_back({c->done, error});
    std::lock_guard lock(mu);
    controls.pop_front();
  }
  has_work = scheduler.has_unfinished_requests();
  update_stats(false);
  return true;
}

void Engine::Impl::answer_controls() {
  std::vector<Answer> ready;
  ready.swap(answers);
  for (Answer& a : ready) {
    if (a.error) {
      a.done->set_exception(a.error);
    } else {
      a.done->set_value();
    }
  }
}

void Engine::Impl::fail_controls(const std::string& why) {
  std::deque<Control> failed;
  {
    std::lock_guard lock(mu);
    failed.swap(controls);
  }
  for (Control& c : failed) c.done->set_exception(std::make_exception_ptr(Error(why)));
}

void Engine::run_control(std::function<bool()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  bool threaded = false;
  {
    std::lock_guard lock(impl_->mu);
    CHECK_AS(Error, !dead_, "engine: the engine has failed");
    impl_->controls.push_back({std::move(fn), done});
    threaded = impl_->thread.joinable() && !impl_->stop_requested;
  }
  impl_->cv.notify_all();
  if (!threaded) {
    while (finished.wait_for(std::chrono::seconds(0)) != std::future_status::ready) step();
  }
  finished.get();
}

void Engine::pause(PauseMode mode, bool clear_cache) {
  run_control([this, mode, clear_cache, started = false]() mutable {
    Impl& m = *impl_;
    if (!m.paused) {
      if (!m.drain(mode, started)) return false;  // the running requests finish first
      log::info("engine: paused (mode {})", mode == PauseMode::kAbort  ? "abort"
                                            : mode == PauseMode::kWait ? "wait"
                                                                       : "keep");
    }
    m.paused = true;
    if (clear_cache) m.scheduler.reset_prefix_cache();
    return true;
  });
}

void Engine::resume() {
  run_control([this] {
    Impl& m = *impl_;
    if (m.sleep_level > 0) {
      throw InvalidRequest("", "the engine is asleep (level " + std::to_string(m.sleep_level) +
                                   "): wake it up first (/wake_up)");
    }
    if (m.paused) log::info("engine: resumed");
    m.reopen();
    return true;
  });
}

bool Engine::is_paused() const {
  return impl_->paused;
}

int32_t Engine::reset_prefix_cache() {
  int32_t dropped = 0;
  run_control([this, &dropped] {
    dropped = impl_->scheduler.reset_prefix_cache();
    log::info("engine: prefix cache reset ({} entries dropped)", dropped);
    return true;
  });
  return dropped;
}

void Engine::sleep(int level, PauseMode mode) {
  if (level != 1 && level != 2) {
    throw InvalidRequest("level", "level must be 1 or 2, got " + std::to_string(level));
  }
  if (mode == PauseMode::kKeep) {
    throw InvalidRequest("mode",
                         "sleep discards the KV cache: mode must be 'abort' or 'wait', not 'keep'");
  }
  run_control([this, level, mode, started = false]() mutable {
    Impl& m = *impl_;
    if (m.sleep_level > 0) return true;  // asleep already: nothing more to free
    if (!started) {
      if (m.paused && m.scheduler.has_unfinished_requests() && mode == PauseMode::kWait) {
        throw InvalidRequest("mode",
                             "the engine is paused with requests kept; sleep with mode 'abort' "
                             "or resume first");
      }
      m.paused_by_sleep = !m.paused;
    }
    if (!m.drain(mode, started)) return false;  // the running requests finish first
    m.paused = true;
    m.scheduler.reset_prefix_cache();
    m.runner.release_graphs();
    m.cache->release();
    m.writable_model.release_weights(level == 1);
    if (m.has_workers) {
      StepPlan plan;
      plan.control = PlanControl::kSleep;
      plan.control_arg = level;
      m.runner.send_control(std::move(plan));
    }
    m.sleep_level = level;
    log::info("engine: asleep (level {}): the KV cache{} freed", level,
              level == 1 ? " is" : " and the weights are");
    return true;
  });
}

void Engine::wake_up(const std::vector<std::string>& tags) {
  bool weights = tags.empty(), kv_cache = tags.empty();
  for (const std::string& t : tags) {
    if (t == "weights") {
      weights = true;
    } else if (t == "kv_cache") {
      kv_cache = true;
    } else {
      throw InvalidRequest("tags", "tags must be 'weights' or 'kv_cache', got '" + t + "'");
    }
  }
  run_control([this, weights, kv_cache] {
    Impl& m = *impl_;
    if (m.sleep_level == 0) return true;
    {
      const UnfrozenScope allocating(m.writable_model.backend());
      if (weights && !m.writable_model.weights_resident()) {
        m.writable_model.restore_weights();
      }
      if (kv_cache) m.cache->restore();
    }
    m.runner.release_graphs();  // captured over the old addresses
    if (m.has_workers) {
      StepPlan plan;
      plan.control = PlanControl::kWakeUp;
      plan.control_arg = (weights ? 1 : 0) | (kv_cache ? 2 : 0);
      m.runner.send_control(std::move(plan));
    }
    if (m.writable_model.weights_resident() && m.cache->resident()) {
      m.sleep_level = 0;
      log::info("engine: awake");
      if (m.paused_by_sleep) m.reopen();
    }
    return true;
  });
}

int Engine::sleep_level() const {
  return impl_->sleep_level;
}

namespace {

// Tensor parallelism: the workers load the update rank 0 has just applied: its folder, and the
// tensors in place of the folder's, relayed over the group's communicator.
void send_update_to_workers(const Model& model, ModelRunner& runner) {
  const auto* ckpt = dynamic_cast<const Checkpoint*>(&model.weights_source());
  CHECK(ckpt != nullptr, "weight updates under tensor parallelism need a checkpoint folder");
  StepPlan plan;
  plan.control = PlanControl::kUpdateWeights;
  plan.weights_dir = ckpt->dir().string();
  std::vector<OverrideTensor> tensors = ckpt->overrides();
  for (const OverrideTensor& t : tensors) {
    plan.tensors.push_back({t.info.name, static_cast<uint8_t>(t.info.dtype), t.info.shape});
  }
  runner.send_control(std::move(plan));
  const UnfrozenScope allocating(model.backend());
  relay_tensors(*model.options().parallel.tp.comm, model.backend(), tensors, /*root=*/true);
}

}  // namespace

void Engine::update_weights(std::unique_ptr<TensorSource> source) {
  auto holder = std::make_shared<std::unique_ptr<TensorSource>>(std::move(source));
  run_control([this, holder] {
    Impl& m = *impl_;
    if (!m.writable_model.weights_resident()) {
      throw InvalidRequest("",
                           "the weights are asleep: wake them up first (/wake_up?tags=weights)");
    }
    CHECK(*holder != nullptr, "update_weights: no source");
    // The source moves into the model (it keeps the host tensors alive); a failed reload
    // leaves the model as it was.
    m.writable_model.reload_weights(std::move(*holder));
    if (m.has_workers) send_update_to_workers(m.model, m.runner);
    const int64_t generation = ++m.weights_generation;
    m.scheduler.set_weights_generation(generation);
    m.scheduler.reset_prefix_cache();
    log::info("engine: weights updated (generation {})", generation);
    return true;
  });
}

void Engine::run_between_steps(const std::function<void(const Model&)>& fn) {
  run_control([this, &fn] {
    const UnfrozenScope allocating(impl_->writable_model.backend());
    fn(impl_->model);
    return true;
  });
}

int64_t Engine::weights_generation() const {
  return impl_->weights_generation;
}

}  // namespace hyserve
