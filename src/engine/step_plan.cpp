#include "engine/step_plan.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "util/error.h"

namespace hyserve {
namespace {

constexpr uint32_t kMagic = 0x4e4c5053;  // "SPLN"

class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    const auto u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void put_count(size_t n) {
    CHECK(n <= std::numeric_limits<uint32_t>::max(), "step plan: ", n, " entries");
    put(static_cast<uint32_t>(n));
  }
  void put(const std::string& s) {
    put_count(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put_count(v.size());
    for (const T& x : v) put(x);
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  template <class T>
  T get(const char* field) {
    static_assert(std::is_integral_v<T>);
    need(sizeof(T), field);
    using U = std::make_unsigned_t<T>;
    U u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<U>(U{in_[at_ + i]} << (8 * i));
    at_ += sizeof(T);
    return static_cast<T>(u);
  }
  bool get_bool(const char* field) {
    const auto b = get<uint8_t>(field);
    CHECK(b <= 1, "step plan: ", field, " is ", int{b}, ", not a bool");
    return b == 1;
  }
  // A count of entries of at least min_bytes each, checked against what is left.
  size_t count(const char* field, size_t min_bytes) {
    const auto n = get<uint32_t>(field);
    need(static_cast<size_t>(n) * min_bytes, field);
    return n;
  }
  std::string get_string(const char* field) {
    const size_t n = count(field, 1);
    std::string s(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }
  template <class T>
  std::vector<T> get_vector(const char* field) {
    const size_t n = count(field, sizeof(T));
    std::vector<T> v(n);
    for (T& x : v) x = get<T>(field);
    return v;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  void need(size_t bytes, const char* field) const {
    CHECK(bytes <= in_.size() - at_, "step plan: truncated at ", field, " (", in_.size() - at_,
          " bytes left, ", bytes, " needed)");
  }
  const std::vector<uint8_t>& in_;
  size_t at_ = 0;
};

}  // namespace

std::vector<uint8_t> encode_plan(const StepPlan& plan) {
  Writer w;
  w.put(kMagic);
  w.put(plan.step);
  w.put(static_cast<uint8_t>(plan.stop));
  w.put(plan.commits);
  w.put_count(plan.dropped.size());
  for (const std::string& id : plan.dropped) w.put(id);
  w.put_count(plan.state_ops.size());
  for (const PlanStateOp& op : plan.state_ops) {
    w.put(op.state_block);
    w.put(op.source_block);
  }
  w.put_count(plan.parts.size());
  for (const PlanPart& part : plan.parts) {
    w.put(static_cast<uint8_t>(part.decode_step));
    w.put(static_cast<uint8_t>(part.verify));
    w.put_count(part.sequences.size());
    for (const PlanSequence& s : part.sequences) {
      w.put(s.request_id);
      w.put(s.num_computed);
      w.put(s.state_block);
      w.put(static_cast<uint8_t>(s.all_logits));
      w.put(static_cast<uint8_t>(s.prefill));
      w.put(s.tokens);
      w.put(s.source_row);
      w.put(s.slots);
      w.put(s.blocks_kept);
      w.put(s.new_blocks);
      w.put(s.lora_slot);
    }
  }
  w.put_count(plan.snapshots.size());
  for (const PlanSnapshot& s : plan.snapshots) {
    w.put(s.state_block);
    w.put(s.snapshot_block);
  }
  w.put(plan.num_sampled);
  w.put(static_cast<uint8_t>(plan.control));
  w.put(plan.control_arg);
  w.put(plan.weights_dir);
  w.put_count(plan.tensors.size());
  for (const PlanTensor& t : plan.tensors) {
    w.put(t.name);
    w.put(t.dtype);
    w.put(t.shape);
  }
  w.put(plan.lora_name);
  w.put(plan.lora_rank);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &plan.lora_scale, 4);
  w.put(scale_bits);
  return w.take();
}

StepPlan decode_plan(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  const auto magic = r.get<uint32_t>("magic");
  CHECK(magic == kMagic, "step plan: bad magic ", magic, " (not a step plan)");
  StepPlan plan;
  plan.step = r.get<uint64_t>("step");
  plan.stop = r.get_bool("stop");
  plan.commits = r.get_vector<int32_t>("commits");
  for (int32_t c : plan.commits) CHECK(c >= 1, "step plan: commit count ", c);
  const size_t num_dropped = r.count("dropped", 4);
  for (size_t i = 0; i < num_dropped; ++i) plan.dropped.push_back(r.get_string("dropped id"));
  const size_t num_ops = r.count("state_ops", 8);
  for (size_t i = 0; i < num_ops; ++i) {
    PlanStateOp op;
    op.state_block = r.get<int32_t>("state_ops");
    op.source_block = r.get<int32_t>("state_ops");
    plan.state_ops.push_back(op);
  }
  const size_t num_parts = r.count("parts", 6);
  for (size_t i = 0; i < num_parts; ++i) {
    PlanPart part;
    part.decode_step = r.get_bool("decode_step");
    part.verify = r.get_bool("verify");
    CHECK(!(part.decode_step && part.verify),
          "step plan: a part both decode step and verification");
    const size_t num_seqs = r.count("sequences", 4);
    for (size_t j = 0; j < num_seqs; ++j) {
      PlanSequence s;
      s.request_id = r.get_string("request_id");
      s.num_computed = r.get<int64_t>("num_computed");
      s.state_block = r.get<int32_t>("state_block");
      s.all_logits = r.get_bool("all_logits");
      s.prefill = r.get_bool("prefill");
      s.tokens = r.get_vector<int32_t>("tokens");
      s.source_row = r.get<int32_t>("source_row");
      s.slots = r.get_vector<int64_t>("slots");
      s.blocks_kept = r.get<int64_t>("blocks_kept");
      s.new_blocks = r.get_vector<int32_t>("new_blocks");
      s.lora_slot = r.get<int32_t>("lora_slot");
      CHECK(s.lora_slot >= -1, "step plan: request ", s.request_id, ": LoRA slot ", s.lora_slot);
      CHECK(s.num_computed >= 0 && s.blocks_kept >= 0 && !s.tokens.empty() &&
                (s.slots.empty() || s.slots.size() == s.tokens.size()),
            "step plan: request ", s.request_id, ": num_computed ", s.num_computed,
            ", blocks_kept ", s.blocks_kept, ", ", s.tokens.size(), " tokens, ", s.slots.size(),
            " slots");
      part.sequences.push_back(std::move(s));
    }
    plan.parts.push_back(std::move(part));
  }
  const size_t num_snapshots = r.count("snapshots", 8);
  for (size_t i = 0; i < num_snapshots; ++i) {
    PlanSnapshot s;
    s.state_block = r.get<int32_t>("snapshots");
    s.snapshot_block = r.get<int32_t>("snapshots");
    plan.snapshots.push_back(s);
  }
  plan.num_sampled = r.get<int32_t>("num_sampled");
  CHECK(plan.num_sampled >= 0, "step plan: num_sampled ", plan.num_sampled);
  const auto control = r.get<uint8_t>("control");
  CHECK(control <= static_cast<uint8_t>(PlanControl::kSetLora), "step plan: control ",
        static_cast<int>(control));
  plan.control = static_cast<PlanControl>(control);
  plan.control_arg = r.get<int32_t>("control_arg");
  plan.weights_dir = r.get_string("weights_dir");
  const size_t num_tensors = r.count("tensors", 9);
  for (size_t i = 0; i < num_tensors; ++i) {
    PlanTensor t;
    t.name = r.get_string("tensor name");
    t.dtype = r.get<uint8_t>("tensor dtype");
    t.shape = r.get_vector<int64_t>("tensor shape");
    plan.tensors.push_back(std::move(t));
  }
  plan.lora_name = r.get_string("lora_name");
  plan.lora_rank = r.get<int64_t>("lora_rank");
  const auto scale_bits = r.get<uint32_t>("lora_scale");
  std::memcpy(&plan.lora_scale, &scale_bits, 4);
  CHECK(plan.lora_rank >= 0, "step plan: LoRA rank ", plan.lora_rank);
  CHECK(r.done(), "step plan: trailing bytes after the LoRA adapter");
  return plan;
}

}  // namespace hyserve
