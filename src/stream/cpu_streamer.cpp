#include "stream/cpu_streamer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "gguf/gguf.h"

namespace sluice::stream {
namespace {

// Reading a gap this small costs less than a separate request (NVMe latency ~ 100 us ~ 200 KB+ at
// 2 GB/s), and keeps each layer to one or a few large reads.
constexpr uint64_t kMaxGap = 1ull << 20;

// "blk.12.attn_q.weight" -> 12; -1 for tensors outside the layers.
int layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int v = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    v = v * 10 + (name[i] - '0');
    if (v > (1 << 20)) return -1;
  }
  return i < name.size() && name[i] == '.' ? v : -1;
}

// Byte ranges [begin, end) of a unit's tensors -> aligned reads packed into one buffer.
void build_runs(std::vector<std::pair<uint64_t, uint64_t>> ranges, UnitLayout& u) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + kMaxGap) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  u.runs.clear();
  u.bytes = 0;
  for (const auto& m : merged) {
    const AlignedRange a = align_range(m.first, m.second - m.first);
    if (!u.runs.empty() && a.offset < u.runs.back().offset + u.runs.back().len) {
      // Aligned neighbours overlap by at most one block: extend the previous read.
      ReadRun& p = u.runs.back();
      const uint64_t end = std::max(p.offset + p.len, a.offset + a.len);
      u.bytes += end - (p.offset + p.len);
      p.len = end - p.offset;
      continue;
    }
    u.runs.push_back({a.offset, a.len, u.bytes});
    u.bytes += a.len;
  }
}

using Field = model::TensorRef model::LayerWeights::*;
constexpr Field kLayerFields[] = {
    &model::LayerWeights::attn_norm, &model::LayerWeights::wq,     &model::LayerWeights::wk,
    &model::LayerWeights::wv,        &model::LayerWeights::wo,     &model::LayerWeights::bq,
    &model::LayerWeights::bk,        &model::LayerWeights::bv,     &model::LayerWeights::q_norm,
    &model::LayerWeights::k_norm,    &model::LayerWeights::ffn_norm, &model::LayerWeights::w_gate,
    &model::LayerWeights::w_up,      &model::LayerWeights::w_down};

// Points `t` at its bytes inside a unit buffer laid out by `u`.
Status relocate(model::TensorRef& t, const gguf::File& f, const UnitLayout& u, uint8_t* base) {
  if (!t.present()) return Status::ok();
  const gguf::TensorInfo* info = f.find_tensor(t.name);
  if (!info) return internal_error("stream: tensor " + t.name + " not in the file");
  const uint64_t off = f.data_offset() + info->offset;
  for (const ReadRun& r : u.runs) {
    if (off >= r.offset && off + info->nbytes <= r.offset + r.len) {
      t.data = base + r.dst + (off - r.offset);
      return Status::ok();
    }
  }
  return internal_error("stream: tensor " + t.name + " is outside the reads of unit " + u.name);
}

Status relocate_layer(model::LayerWeights& lw, const gguf::File& f, const UnitLayout& u, uint8_t* base) {
  for (Field fld : kLayerFields) SLUICE_RETURN_IF_ERROR(relocate(lw.*fld, f, u, base));
  return Status::ok();
}

uint64_t round_up(uint64_t v) { return (v + kIoAlign - 1) / kIoAlign * kIoAlign; }

}  // namespace

Result<FileLayout> layout_of(const gguf::File& file) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> layer_ranges;
  std::vector<std::pair<uint64_t, uint64_t>> global_ranges;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const uint64_t b = file.data_offset() + t.offset;
    const int l = layer_of(t.name);
    if (l < 0) {
      global_ranges.push_back({b, b + t.nbytes});
      continue;
    }
    if (size_t(l) >= layer_ranges.size()) layer_ranges.resize(size_t(l) + 1);
    layer_ranges[size_t(l)].push_back({b, b + t.nbytes});
  }
  FileLayout out;
  out.layers.resize(layer_ranges.size());
  for (size_t l = 0; l < layer_ranges.size(); ++l) {
    out.layers[l].name = "blk." + std::to_string(l);
    build_runs(std::move(layer_ranges[l]), out.layers[l]);
  }
  out.globals.name = "globals";
  build_runs(std::move(global_ranges), out.globals);
  if (out.layers.empty()) return invalid_argument(file.path() + ": no blk.* tensors to stream");
  return out;
}

Result<CpuPlan> plan_cpu(const FileLayout& layout, const CpuStreamOptions& opts) {
  if (opts.n_slots < 1) return invalid_argument("--slots must be >= 1, got " + std::to_string(opts.n_slots));
  CpuPlan cp;
  cp.globals_bytes = layout.globals.bytes;
  cp.input.has_gpu = false;
  cp.input.min_slots = opts.n_slots;
  cp.input.bw = opts.bw;
  for (const UnitLayout& u : layout.layers) cp.input.units.push_back({u.name, u.bytes});

  // The smallest budget any placement fits, by the planner's own rule (largest units resident
  // first, the rest through min(n_slots, streamed) slots of the largest streamed unit).
  std::vector<uint64_t> sizes;
  for (const Unit& u : cp.input.units) sizes.push_back(u.bytes);
  std::sort(sizes.rbegin(), sizes.rend());
  uint64_t min_layers = UINT64_MAX, resident = 0;
  for (size_t r = 0; r <= sizes.size(); ++r) {
    if (r > 0) resident += sizes[r - 1];
    const size_t m = sizes.size() - r;
    const uint64_t slots = std::min<uint64_t>(uint64_t(opts.n_slots), m);
    min_layers = std::min(min_layers, resident + slots * (m ? sizes[r] : 0));
  }
  const uint64_t minimum = cp.globals_bytes + min_layers;
  if (opts.ram_budget < minimum) {
    return invalid_argument("RAM budget " + format_bytes(opts.ram_budget) + " is too small: at least " +
                            format_bytes(minimum) + " (" + std::to_string(minimum) + " bytes) is needed: " +
                            format_bytes(cp.globals_bytes) + " of non-layer tensors (embeddings, output) + " +
                            std::to_string(opts.n_slots) + " slots of the largest layer (" +
                            format_bytes(sizes.front()) + ")");
  }
  cp.input.ram_budget = opts.ram_budget - cp.globals_bytes;
  SLUICE_ASSIGN_OR_RETURN(cp.plan, make_plan(cp.input));
  cp.total_bytes = cp.globals_bytes + cp.plan.resident_bytes + uint64_t(cp.plan.n_slots) * cp.plan.slot_bytes;
  return cp;
}

std::string CpuPlan::describe() const {
  std::string s = plan.describe(input);
  char line[256];
  std::snprintf(line, sizeof line,
                "  non-layer tensors %s resident; weights in RAM %s of the %s budget (disk %s/token read with "
                "O_DIRECT)\n",
                format_bytes(globals_bytes).c_str(), format_bytes(total_bytes).c_str(),
                format_bytes(input.ram_budget + globals_bytes).c_str(), format_bytes(plan.disk_bytes).c_str());
  return s + line;
}

void CpuLayerStreamer::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

CpuLayerStreamer::~CpuLayerStreamer() = default;

Result<std::unique_ptr<CpuLayerStreamer>> CpuLayerStreamer::create(const std::string& path, const gguf::File& file,
                                                                   const model::Weights& w,
                                                                   const CpuStreamOptions& opts) {
  std::unique_ptr<CpuLayerStreamer> s(new CpuLayerStreamer());
  s->trace_ = opts.trace;
  SLUICE_ASSIGN_OR_RETURN(s->layout_, layout_of(file));
  const size_t n_layer = w.layers.size();
  if (s->layout_.layers.size() != n_layer) {
    return invalid_argument(path + ": file has " + std::to_string(s->layout_.layers.size()) +
                            " blk.* layers, the model expects " + std::to_string(n_layer));
  }
  SLUICE_ASSIGN_OR_RETURN(s->plan_, plan_cpu(s->layout_, opts));
  SLUICE_ASSIGN_OR_RETURN(s->reader_, FileReader::open(path, opts.io));
  FileReader& rd = *s->reader_;
  if (rd.file_size() != file.file_size()) {
    return io_error(path + ": the model file changed while loading (size " + std::to_string(file.file_size()) +
                    " -> " + std::to_string(rd.file_size()) + ")");
  }
  const Plan& plan = s->plan_.plan;

  auto alloc = [&](uint64_t bytes) -> Result<Buffer> {
    if (bytes == 0) return Buffer();
    void* p = std::aligned_alloc(kIoAlign, round_up(bytes));
    if (!p) return out_of_memory("stream: cannot allocate " + format_bytes(bytes) + " for weights");
    return Buffer(static_cast<uint8_t*>(p));
  };

  // Resident memory: the non-layer tensors, then every RAM-resident layer, each at an aligned start.
  std::vector<uint64_t> unit_at(n_layer, 0);
  uint64_t at = round_up(s->layout_.globals.bytes);
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home != Home::kRam) continue;
    unit_at[l] = at;
    at += round_up(s->layout_.layers[l].bytes);
  }
  s->resident_bytes_ = at;
  SLUICE_ASSIGN_OR_RETURN(s->resident_, alloc(at));
  uint8_t* rbase = s->resident_.get();
  {
    const auto load_start = FileReader::Clock::now();
    std::vector<FileReader::Ticket> tickets;
    auto read_unit = [&](const UnitLayout& u, uint8_t* base) -> Status {
      for (const ReadRun& r : u.runs) {
        SLUICE_ASSIGN_OR_RETURN(FileReader::Ticket t, rd.submit(r.offset, r.len, base + r.dst));
        tickets.push_back(t);
      }
      return Status::ok();
    };
    Status st = read_unit(s->layout_.globals, rbase);
    for (size_t l = 0; l < n_layer && st.is_ok(); ++l) {
      if (plan.units[l].home == Home::kRam) st = read_unit(s->layout_.layers[l], rbase + unit_at[l]);
    }
    for (FileReader::Ticket t : tickets) {  // wait for all, even after an error: buffers must not be freed under a read
      Status ws = rd.wait(t);
      if (st.is_ok()) st = ws;
    }
    SLUICE_RETURN_IF_ERROR(st);
    if (s->trace_) {
      s->trace_->append({s->trace_->us(load_start), s->trace_->now_us(), "load", -1, "resident", "disk", at});
    }
  }

  s->globals_ = w;
  s->globals_.layers.clear();
  for (model::TensorRef* t : {&s->globals_.token_embd, &s->globals_.output_norm, &s->globals_.output,
                              &s->globals_.rope_freqs}) {
    SLUICE_RETURN_IF_ERROR(relocate(*t, file, s->layout_.globals, rbase));
  }

  // Slots: the ring every streamed layer passes through.
  const int n_slots = plan.n_slots;
  s->stream_index_.assign(n_layer, -1);
  s->resident_views_.resize(n_layer);
  size_t max_runs = 0;
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home == Home::kRam) {
      s->resident_views_[l] = w.layers[l];
      SLUICE_RETURN_IF_ERROR(relocate_layer(s->resident_views_[l], file, s->layout_.layers[l], rbase + unit_at[l]));
    } else {
      s->stream_index_[l] = int(s->streamed_.size());
      s->streamed_.push_back(int(l));
      max_runs = std::max(max_runs, s->layout_.layers[l].runs.size());
    }
  }
  if (!s->streamed_.empty()) {
    const uint64_t slot_bytes = round_up(plan.slot_bytes);
    s->slot_pool_bytes_ = slot_bytes * uint64_t(n_slots);
    SLUICE_ASSIGN_OR_RETURN(s->slot_pool_, alloc(s->slot_pool_bytes_));
    s->slots_.resize(size_t(n_slots));
    for (int k = 0; k < n_slots; ++k) {
      s->slot_lanes_.push_back("disk slot " + std::to_string(k));
      s->slots_[size_t(k)].base = s->slot_pool_.get() + uint64_t(k) * slot_bytes;
      s->slots_[size_t(k)].tickets.reserve(max_runs);
    }
    s->slot_views_.resize(s->streamed_.size() * size_t(n_slots));
    for (size_t j = 0; j < s->streamed_.size(); ++j) {
      const size_t l = size_t(s->streamed_[j]);
      for (int k = 0; k < n_slots; ++k) {
        model::LayerWeights& v = s->slot_views_[j * size_t(n_slots) + size_t(k)];
        v = w.layers[l];
        SLUICE_RETURN_IF_ERROR(relocate_layer(v, file, s->layout_.layers[l], s->slots_[size_t(k)].base));
      }
    }
    // Fill the ring: the first n_slots streamed layers of the first pass are read during start-up.
    for (int k = 0; k < n_slots; ++k) SLUICE_RETURN_IF_ERROR(s->submit_next());
  }
  return s;
}

Status CpuLayerStreamer::fail(Status st) {
  if (failed_.is_ok()) failed_ = std::move(st);
  return failed_;
}

Status CpuLayerStreamer::submit_next() {
  const uint64_t seq = submitted_;
  const size_t m = streamed_.size();
  Slot& slot = slots_[seq % slots_.size()];
  SLUICE_CHECK(slot.state == SlotState::kFree, "stream: submitting into a slot that is not free");
  const UnitLayout& u = layout_.layers[size_t(streamed_[seq % m])];
  slot.tickets.clear();  // keeps its capacity: no allocation
  slot.seq = seq;
  slot.state = SlotState::kReading;
  slot.submitted = FileReader::Clock::now();
  ++submitted_;
  for (const ReadRun& r : u.runs) {
    auto t = reader_->submit(r.offset, r.len, slot.base + r.dst);
    if (!t.is_ok()) return fail(t.status());
    slot.tickets.push_back(*t);
  }
  return Status::ok();
}

Status CpuLayerStreamer::begin_pass(int n_tokens) {
  if (!failed_.is_ok()) return failed_;
  // Once per token: a file replaced or truncated under us must stop generation, not feed the
  // layers a mix of two files (fstat + stat: microseconds).
  if (Status st = reader_->check_unchanged(); !st.is_ok()) return fail(std::move(st));
  decode_pass_ = n_tokens == 1;
  ++stats_.passes;
  if (decode_pass_) ++stats_.decode_passes;
  return Status::ok();
}

Result<const model::LayerWeights*> CpuLayerStreamer::acquire(int layer) {
  if (!failed_.is_ok()) return failed_;
  SLUICE_CHECK(layer >= 0 && size_t(layer) < stream_index_.size(), "stream: layer out of range");
  const int idx = stream_index_[size_t(layer)];
  const uint64_t bytes = layout_.layers[size_t(layer)].bytes;
  if (idx < 0) {
    stats_.ram_bytes += bytes;
    if (decode_pass_) stats_.decode_ram_bytes += bytes;
    if (trace_) compute_start_ = FileReader::Clock::now();
    return &resident_views_[size_t(layer)];
  }
  const size_t m = streamed_.size();
  SLUICE_CHECK(streamed_[next_seq_ % m] == layer, "stream: layers must be acquired in order");
  const size_t k = next_seq_ % slots_.size();
  Slot& slot = slots_[k];
  SLUICE_CHECK(slot.state == SlotState::kReading && slot.seq == next_seq_, "stream: slot not holding the next layer");
  const auto t0 = FileReader::Clock::now();
  Status st;
  FileReader::Clock::time_point arrived = slot.submitted;  // the last byte of the layer
  for (FileReader::Ticket t : slot.tickets) {  // wait for every read, even after an error
    FileReader::Clock::time_point done{};
    Status ws = reader_->wait(t, &done);
    arrived = std::max(arrived, done);
    if (st.is_ok()) st = std::move(ws);
  }
  slot.tickets.clear();
  const auto t1 = FileReader::Clock::now();
  const double waited = std::chrono::duration<double>(t1 - t0).count();
  if (!st.is_ok()) return fail(std::move(st));
  slot.state = SlotState::kInUse;
  stats_.stall_seconds += waited;
  stats_.bytes_read += bytes;
  if (decode_pass_) {
    stats_.decode_stall_seconds += waited;
    stats_.decode_bytes_read += bytes;
    // Reads of successive slots overlap in time; count each instant once.
    const auto from = std::max(slot.submitted, busy_until_);
    if (arrived > from) stats_.decode_read_busy_seconds += std::chrono::duration<double>(arrived - from).count();
  }
  busy_until_ = std::max(busy_until_, arrived);
  if (trace_) {
    const std::string& name = layout_.layers[size_t(layer)].name;
    trace_->append({trace_->us(slot.submitted), trace_->us(arrived), slot_lanes_[k], layer, name, "disk", bytes});
    if (t1 - t0 > std::chrono::microseconds(1)) {
      trace_->append({trace_->us(t0), trace_->us(t1), "stall", layer, name, "disk", 0});
    }
    compute_start_ = t1;
  }
  return &slot_views_[size_t(idx) * slots_.size() + k];
}

void CpuLayerStreamer::release(int layer) {
  SLUICE_CHECK(layer >= 0 && size_t(layer) < stream_index_.size(), "stream: layer out of range");
  const bool resident = stream_index_[size_t(layer)] < 0;
  if (trace_ && failed_.is_ok()) {
    const UnitLayout& u = layout_.layers[size_t(layer)];
    trace_->append({trace_->us(compute_start_), trace_->now_us(), "cpu", layer, u.name, resident ? "ram" : "disk",
                    u.bytes});
  }
  if (resident) return;
  Slot& slot = slots_[next_seq_ % slots_.size()];
  if (slot.state != SlotState::kInUse) return;  // acquire failed; the error is already sticky
  slot.state = SlotState::kFree;
  ++next_seq_;
  // The freed slot takes the layer n_slots ahead (wrapping into the next pass).
  if (failed_.is_ok()) (void)submit_next();
}

std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
cpu_streaming_source(const std::string& path, const CpuStreamOptions& opts, CpuLayerStreamer** out) {
  return [path, opts, out](const gguf::File& file, const model::Weights& w,
                           backend::Backend& be) -> Result<std::unique_ptr<model::LayerSource>> {
    if (!be.reads_host_weights()) {
      return unsupported(std::string("CPU streaming computes on host memory; the ") + be.name() +
                         " backend cannot use it (use --backend cpu)");
    }
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<CpuLayerStreamer> s, CpuLayerStreamer::create(path, file, w, opts));
    if (out) *out = s.get();
    return std::unique_ptr<model::LayerSource>(std::move(s));
  };
}

}  // namespace sluice::stream
