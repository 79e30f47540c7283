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

// Bytes [begin, end) of one file.
struct ByteRange {
  uint32_t file = 0;
  uint64_t begin = 0, end = 0;
  bool operator<(const ByteRange& o) const {
    return file != o.file ? file < o.file : begin != o.begin ? begin < o.begin : end < o.end;
  }
};

// Byte ranges of a unit's tensors -> aligned reads packed into one buffer (ranges of one file
// merge; files never do); returns the buffer's bytes.
uint64_t build_runs(std::vector<ByteRange> ranges, std::vector<ReadRun>& runs) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<ByteRange> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.file == merged.back().file && r.begin <= merged.back().end + kMaxGap) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  runs.clear();
  uint64_t bytes = 0;
  for (const auto& m : merged) {
    const AlignedRange a = align_range(m.begin, m.end - m.begin);
    if (!runs.empty() && runs.back().file == m.file && a.offset < runs.back().offset + runs.back().len) {
      // Aligned neighbours overlap by at most one block: extend the previous read.
      ReadRun& p = runs.back();
      const uint64_t end = std::max(p.offset + p.len, a.offset + a.len);
      bytes += end - (p.offset + p.len);
      p.len = end - p.offset;
      continue;
    }
    runs.push_back({m.file, a.offset, a.len, bytes});
    bytes += a.len;
  }
  return bytes;
}

}  // namespace

bool locate(const std::vector<ReadRun>& runs, uint32_t file, uint64_t off, uint64_t n, uint64_t* at) {
  for (const ReadRun& r : runs) {
    if (r.file == file && off >= r.offset && off + n <= r.offset + r.len) {
      *at = r.dst + (off - r.offset);
      return true;
    }
  }
  return false;
}

namespace {

using Field = model::LayerTensorField;
constexpr const auto& kLayerFields = model::kLayerTensorFields;

// Points `t` at its bytes: the repacked copy in `pack_base` where the unit repacks it (and
// pack_base is given), else inside a buffer at `base` laid out by `runs`.
Status relocate(model::TensorRef& t, const gguf::File& f, const UnitLayout& u, const std::vector<ReadRun>& runs,
                uint8_t* base, uint8_t* pack_base) {
  if (!t.present()) return Status::ok();
  if (pack_base) {
    for (const PackedTensor& p : u.packed) {
      if (p.name != t.name) continue;
      if (p.shape.type != t.type || p.shape.ne0 != t.ne0 || p.shape.ne1 != t.ne1 * t.ne2) {
        return internal_error("stream: tensor " + t.name + " is used with another shape than the file's");
      }
      t.data = pack_base + p.dst;
      t.packed = true;
      return Status::ok();
    }
  }
  const gguf::TensorInfo* info = f.find_tensor(t.name);
  if (!info) return internal_error("stream: tensor " + t.name + " not in the file");
  uint64_t at = 0;
  if (!locate(runs, info->shard, f.file_offset(*info), info->nbytes, &at)) {
    return internal_error("stream: tensor " + t.name + " is outside the reads of unit " + u.name);
  }
  t.data = base + at;
  t.packed = false;
  return Status::ok();
}

Status relocate_layer(model::LayerWeights& lw, const gguf::File& f, const UnitLayout& u,
                      const std::vector<ReadRun>& runs, uint8_t* base, uint8_t* pack_base) {
  for (Field fld : kLayerFields) SLUICE_RETURN_IF_ERROR(relocate(lw.*fld, f, u, runs, base, pack_base));
  return Status::ok();
}

uint64_t round_up(uint64_t v) { return (v + kIoAlign - 1) / kIoAlign * kIoAlign; }

}  // namespace

Result<std::unique_ptr<FileReader>> open_reader(const gguf::File& file, const IoOptions& io) {
  std::vector<std::string> paths;
  for (const gguf::Shard& sh : file.shards()) paths.push_back(sh.path);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> rd, FileReader::open(paths, io));
  for (size_t k = 0; k < paths.size(); ++k) {
    const uint64_t was = file.shards()[k].size, now = rd->file_size(uint32_t(k));
    if (was != now) {
      return io_error(paths[k] + ": the model file changed while loading (size " + std::to_string(was) + " -> " +
                      std::to_string(now) + ")");
    }
  }
  return rd;
}

Result<FileLayout> layout_of(const gguf::File& file, const backend::Backend* be) {
  struct Ranges {
    std::vector<ByteRange> all, kept;
    std::vector<PackedTensor> packed;
  };
  std::vector<Ranges> layers;
  Ranges globals;
  // The backend's bytes for this tensor used as a matrix (0: computed on in the file's layout).
  // A tensor as the matrix the backend repacks: stacked experts [ne0, ne1, n_expert] are one
  // matrix of ne1 * n_expert rows, repacked only where no row group straddles two experts (as
  // Model::load's upload does, model::repacked_bytes), so every run repacks the same tensors.
  auto as_matrix = [](const gguf::TensorInfo& t) {
    int64_t rows = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) rows *= int64_t(t.shape[d]);
    return backend::WeightView{t.type, int64_t(t.shape[0]), rows};
  };
  auto repacked = [&](const gguf::TensorInfo& t) -> uint64_t {
    if (!be || t.shape.empty() || t.shape.size() > 3) return 0;
    if (t.shape.size() == 3) {
      const int group = quant::kernels(t.type).packed_rows;
      if (group <= 0 || t.shape[1] % uint64_t(group) != 0) return 0;
    }
    return uint64_t(std::max<int64_t>(be->repacked_bytes(as_matrix(t)), 0));
  };
  const bool tied_output = file.find_tensor("output.weight") == nullptr;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const uint64_t b = file.file_offset(t);
    const int l = layer_of(t.name);
    if (l >= 0 && size_t(l) >= layers.size()) layers.resize(size_t(l) + 1);
    Ranges& r = l < 0 ? globals : layers[size_t(l)];
    r.all.push_back({t.shard, b, b + t.nbytes});
    // token_embd's rows are looked up in the file's layout (get_rows); when it is also the output
    // (tied), the output is a repacked copy, as Model::load's upload_weights makes.
    const bool table = t.name == "token_embd.weight";
    const uint64_t pb = table && !tied_output ? 0 : repacked(t);
    if (table || pb == 0) r.kept.push_back({t.shard, b, b + t.nbytes});
    if (pb > 0) {
      PackedTensor p;
      p.name = t.name;
      p.shape = as_matrix(t);
      p.file = t.shard;
      p.offset = b;
      p.bytes = pb;
      r.packed.push_back(std::move(p));
    }
  }
  auto finish = [](Ranges&& r, UnitLayout& u) -> Status {
    u.bytes = build_runs(std::move(r.all), u.runs);
    u.kept_bytes = build_runs(std::move(r.kept), u.kept_runs);
    u.packed = std::move(r.packed);
    uint64_t at = 0;
    for (PackedTensor& p : u.packed) {
      if (!locate(u.runs, p.file, p.offset, uint64_t(p.shape.ne1 * p.shape.row_bytes()), &p.src)) {
        return internal_error("stream: tensor " + p.name + " is outside the reads of unit " + u.name);
      }
      p.dst = at;
      at += (p.bytes + 63) / 64 * 64;  // the packed kernels' loads want 64-byte aligned groups
    }
    u.packed_bytes = round_up(at);
    return Status::ok();
  };
  FileLayout out;
  out.layers.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    out.layers[l].name = "blk." + std::to_string(l);
    SLUICE_RETURN_IF_ERROR(finish(std::move(layers[l]), out.layers[l]));
  }
  out.globals.name = "globals";
  SLUICE_RETURN_IF_ERROR(finish(std::move(globals), out.globals));
  if (out.layers.empty()) return invalid_argument(file.path() + ": no blk.* tensors to stream");
  return out;
}

namespace {

// RAM one choice of resident layers needs: `r` resident (the first r of `order`, largest file
// bytes first), the rest streamed through min(n_slots, streamed) slots of the largest of them and
// one packed buffer the largest of their repacked matrices fit.
struct Placement {
  size_t r = 0;
  int slots = 0;
  uint64_t resident = 0, slot = 0, pack = 0, need = 0;
};
std::vector<size_t> largest_first(const FileLayout& layout) {
  std::vector<size_t> order(layout.layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return layout.layers[a].bytes > layout.layers[b].bytes; });
  return order;
}
Placement placement(const FileLayout& layout, const std::vector<size_t>& order, size_t r, int n_slots) {
  Placement p;
  p.r = r;
  for (size_t k = 0; k < order.size(); ++k) {
    const UnitLayout& u = layout.layers[order[k]];
    if (k < r) {
      p.resident += u.ram_bytes();
    } else {
      p.slot = std::max(p.slot, u.bytes);
      p.pack = std::max(p.pack, u.packed_bytes);
    }
  }
  p.slots = int(std::min<size_t>(size_t(std::max(n_slots, 1)), order.size() - r));
  p.need = layout.globals.ram_bytes() + p.resident + uint64_t(p.slots) * p.slot + p.pack;
  return p;
}
Placement smallest(const FileLayout& layout, const std::vector<size_t>& order, int n_slots) {
  Placement best = placement(layout, order, 0, n_slots);
  for (size_t r = 1; r <= order.size(); ++r) {
    const Placement p = placement(layout, order, r, n_slots);
    if (p.need < best.need) best = p;
  }
  return best;
}

}  // namespace

uint64_t min_ram_budget(const FileLayout& layout, int n_slots) {
  return smallest(layout, largest_first(layout), n_slots).need;
}

Status leave_out_layers(FileLayout& layout, const std::vector<bool>& skip) {
  if (skip.empty()) return Status::ok();
  if (skip.size() != layout.layers.size()) {
    return invalid_argument("layers to leave out: " + std::to_string(skip.size()) + " flags for " +
                            std::to_string(layout.layers.size()) + " layers");
  }
  for (size_t l = 0; l < skip.size(); ++l) {
    if (!skip[l]) continue;
    UnitLayout none;
    none.name = layout.layers[l].name;
    layout.layers[l] = std::move(none);
  }
  return Status::ok();
}

Result<CpuPlan> plan_cpu(const FileLayout& layout, const CpuStreamOptions& opts) {
  if (opts.n_slots < 1) return invalid_argument("--slots must be >= 1, got " + std::to_string(opts.n_slots));
  const std::vector<size_t> order = largest_first(layout);
  const Placement low = smallest(layout, order, opts.n_slots);
  const uint64_t globals = layout.globals.ram_bytes();
  if (opts.ram_budget < low.need) {
    std::string parts = format_bytes(globals) + " of non-layer tensors (embeddings, output)";
    if (low.r > 0) parts += " + " + std::to_string(low.r) + " resident layers (" + format_bytes(low.resident) + ")";
    parts += " + " + std::to_string(low.slots) + " slots of the largest layer (" + format_bytes(low.slot) + ")";
    if (low.pack > 0) parts += " + " + format_bytes(low.pack) + " to repack a streamed layer into";
    return invalid_argument("RAM budget " + format_bytes(opts.ram_budget) + " is too small: at least " +
                            format_bytes(low.need) + " (" + std::to_string(low.need) + " bytes) is needed: " + parts);
  }
  // In CPU-only mode every byte not resident is read from disk each pass, and compute reads every
  // byte wherever it lies: the most resident bytes that fit is the fastest placement.
  Placement pick = low;
  for (size_t r = order.size() + 1; r-- > 0;) {
    const Placement p = placement(layout, order, r, opts.n_slots);
    if (p.need <= opts.ram_budget) {
      pick = p;
      break;
    }
  }
  CpuPlan cp;
  cp.budget = opts.ram_budget;
  cp.globals_bytes = globals;
  cp.input.has_gpu = false;
  cp.input.min_slots = opts.n_slots;
  cp.input.bw = opts.bw;
  cp.input.ram_budget = opts.ram_budget - globals;
  for (const UnitLayout& u : layout.layers) cp.input.units.push_back({u.name, u.bytes});
  Plan& p = cp.plan;
  p.units.assign(layout.layers.size(), UnitPlan{Home::kDisk, Executor::kCpu});
  for (size_t k = 0; k < pick.r; ++k) p.units[order[k]].home = Home::kRam;
  // A layer with nothing to read (left out of every pass: leave_out_layers) is held, at no bytes.
  size_t empty_streamed = 0;
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    if (layout.layers[l].bytes == 0 && p.units[l].home != Home::kRam) {
      p.units[l].home = Home::kRam;
      ++empty_streamed;
    }
  }
  const bool streams = pick.r + empty_streamed < order.size();
  p.n_slots = streams ? pick.slots : 0;
  p.slot_bytes = streams ? pick.slot : 0;
  score_plan(cp.input, p);
  cp.resident_ram_bytes = pick.resident;
  cp.pack_bytes = streams ? pick.pack : 0;
  cp.total_bytes = pick.need;
  return cp;
}

std::string CpuPlan::describe() const {
  std::string s = plan.describe(input);
  char line[320];
  std::snprintf(line, sizeof line,
                "  non-layer tensors %s resident; weights in RAM %s of the %s budget (disk %s/token read with "
                "O_DIRECT)\n",
                format_bytes(globals_bytes).c_str(), format_bytes(total_bytes).c_str(), format_bytes(budget).c_str(),
                format_bytes(plan.disk_bytes).c_str());
  s += line;
  if (pack_bytes > 0) {
    std::snprintf(line, sizeof line,
                  "  streamed layers are repacked into the CPU's packed layout after their read (a %s buffer)\n",
                  format_bytes(pack_bytes).c_str());
    s += line;
  }
  return s;
}

void CpuLayerStreamer::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

CpuLayerStreamer::~CpuLayerStreamer() = default;

namespace {

// Load-time staging for repacking resident matrices when the slots are smaller than this (or
// there are none): freed before the first pass; within the allowance over the budget that
// activations and the KV cache also take (tests/e2e/stream_cpu.sh).
constexpr uint64_t kLoadStaging = 4ull << 20;

}  // namespace

Result<std::unique_ptr<CpuLayerStreamer>> CpuLayerStreamer::create(const std::string& path, const gguf::File& file,
                                                                   const model::Weights& w, backend::Backend& be,
                                                                   const CpuStreamOptions& opts) {
  std::unique_ptr<CpuLayerStreamer> s(new CpuLayerStreamer());
  s->trace_ = opts.trace;
  s->be_ = &be;
  SLUICE_ASSIGN_OR_RETURN(s->layout_, layout_of(file, &be));
  const size_t n_layer = w.layers.size();
  if (s->layout_.layers.size() != n_layer) {
    return invalid_argument(path + ": file has " + std::to_string(s->layout_.layers.size()) +
                            " blk.* layers, the model expects " + std::to_string(n_layer));
  }
  // Layers no pass runs weigh nothing: the planner keeps them "resident" at zero bytes.
  SLUICE_RETURN_IF_ERROR(leave_out_layers(s->layout_, opts.skip));
  s->skip_ = opts.skip;
  SLUICE_ASSIGN_OR_RETURN(s->plan_, plan_cpu(s->layout_, opts));
  SLUICE_ASSIGN_OR_RETURN(s->reader_, open_reader(file, opts.io));
  FileReader& rd = *s->reader_;
  const Plan& plan = s->plan_.plan;

  auto alloc = [&](uint64_t bytes) -> Result<Buffer> {
    if (bytes == 0) return Buffer();
    void* p = std::aligned_alloc(kIoAlign, round_up(bytes));
    if (!p) return out_of_memory("stream: cannot allocate " + format_bytes(bytes) + " for weights");
    return Buffer(static_cast<uint8_t*>(p));
  };

  // Resident memory: the non-layer tensors, then every RAM-resident layer; each unit is its kept
  // tensors in the file's layout, then its repacked matrices, each part at an aligned start.
  struct At {
    uint64_t kept = 0, packed = 0;
  };
  std::vector<const UnitLayout*> units = {&s->layout_.globals};
  std::vector<At> unit_at;
  uint64_t at = 0;
  auto place = [&](const UnitLayout& u) {
    unit_at.push_back({at, at + round_up(u.kept_bytes)});
    at += round_up(u.kept_bytes) + u.packed_bytes;
  };
  place(s->layout_.globals);
  std::vector<size_t> layer_unit(n_layer, 0);  // index into units / unit_at
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home != Home::kRam) continue;
    layer_unit[l] = units.size();
    units.push_back(&s->layout_.layers[l]);
    place(s->layout_.layers[l]);
  }
  s->resident_bytes_ = at;
  SLUICE_ASSIGN_OR_RETURN(s->resident_, alloc(at));
  uint8_t* rbase = s->resident_.get();

  // Slots (and the packed buffer streamed layers are repacked into) before the resident reads:
  // the slots, unused until the first pass, are the staging the resident matrices are packed from.
  s->stream_index_.assign(n_layer, -1);
  size_t max_runs = 0;
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home == Home::kRam) continue;
    s->stream_index_[l] = int(s->streamed_.size());
    s->streamed_.push_back(int(l));
    max_runs = std::max(max_runs, s->layout_.layers[l].runs.size());
  }
  const int n_slots = plan.n_slots;
  const uint64_t slot_bytes = round_up(plan.slot_bytes);
  if (!s->streamed_.empty()) {
    s->slot_pool_bytes_ = slot_bytes * uint64_t(n_slots);
    SLUICE_ASSIGN_OR_RETURN(s->slot_pool_, alloc(s->slot_pool_bytes_));
    s->pack_pool_bytes_ = s->plan_.pack_bytes;
    SLUICE_ASSIGN_OR_RETURN(s->pack_pool_, alloc(s->pack_pool_bytes_));
  }

  {
    const auto load_start = FileReader::Clock::now();
    std::vector<FileReader::Ticket> tickets;
    std::vector<uint64_t> ticket_bytes;  // progress: bytes each read brings
    uint64_t total = 0, done = 0;
    for (const UnitLayout* u : units) {
      for (const ReadRun& r : u->kept_runs) total += r.len;
      for (const PackedTensor& p : u->packed) total += uint64_t(p.shape.row_bytes()) * uint64_t(p.shape.ne1);
    }
    auto progress = [&](uint64_t bytes) {
      done += bytes;
      if (opts.on_load_progress && total) opts.on_load_progress(done, total);
    };
    progress(0);
    auto read_unit = [&](const UnitLayout& u, uint8_t* base) -> Status {
      for (const ReadRun& r : u.kept_runs) {
        SLUICE_ASSIGN_OR_RETURN(FileReader::Ticket t, rd.submit(r.file, r.offset, r.len, base + r.dst));
        tickets.push_back(t);
        ticket_bytes.push_back(r.len);
      }
      return Status::ok();
    };
    Status st;
    for (size_t i = 0; i < units.size() && st.is_ok(); ++i) st = read_unit(*units[i], rbase + unit_at[i].kept);
    for (size_t i = 0; i < tickets.size(); ++i) {  // wait for all, even after an error: buffers must not be freed under a read
      Status ws = rd.wait(tickets[i]);
      if (st.is_ok()) st = ws;
      if (st.is_ok()) progress(ticket_bytes[i]);
    }
    SLUICE_RETURN_IF_ERROR(st);

    // Repacked matrices: read a staging buffer's worth of whole row groups at a time and pack
    // them with the backend's own function, so the file's layout of a matrix is never held in
    // full next to its packed copy.
    bool any_packed = false;
    for (const UnitLayout* u : units) any_packed |= !u->packed.empty();
    if (any_packed) {
      Buffer own_staging;
      uint8_t* staging = s->slot_pool_.get();
      uint64_t staging_bytes = s->slot_pool_bytes_;
      if (staging_bytes < kLoadStaging) {
        SLUICE_ASSIGN_OR_RETURN(own_staging, alloc(kLoadStaging));
        staging = own_staging.get();
        staging_bytes = kLoadStaging;
      }
      for (size_t i = 0; i < units.size(); ++i) {
        for (const PackedTensor& p : units[i]->packed) {
          SLUICE_RETURN_IF_ERROR(
              s->pack_from_file(p, rbase + unit_at[i].packed + p.dst, staging, staging_bytes));
          progress(uint64_t(p.shape.row_bytes()) * uint64_t(p.shape.ne1));
        }
      }
    }
    if (s->trace_) {
      s->trace_->append({s->trace_->us(load_start), s->trace_->now_us(), "load", -1, "resident", "disk", at});
    }
  }

  s->globals_ = w;
  s->globals_.layers.clear();
  const UnitLayout& g = s->layout_.globals;
  // token_embd is looked up by rows in the file's layout; the output (possibly the same tensor,
  // tied) is the repacked copy where there is one.
  SLUICE_RETURN_IF_ERROR(relocate(s->globals_.token_embd, file, g, g.kept_runs, rbase + unit_at[0].kept, nullptr));
  for (model::TensorRef* t : {&s->globals_.output_norm, &s->globals_.output, &s->globals_.rope_freqs}) {
    SLUICE_RETURN_IF_ERROR(relocate(*t, file, g, g.kept_runs, rbase + unit_at[0].kept, rbase + unit_at[0].packed));
  }

  s->resident_views_.resize(n_layer);
  for (size_t l = 0; l < n_layer; ++l) {
    if (plan.units[l].home != Home::kRam || s->skipped(int(l))) continue;
    const UnitLayout& u = s->layout_.layers[l];
    const At& a = unit_at[layer_unit[l]];
    s->resident_views_[l] = w.layers[l];
    SLUICE_RETURN_IF_ERROR(relocate_layer(s->resident_views_[l], file, u, u.kept_runs, rbase + a.kept, rbase + a.packed));
  }

  // Slots: the ring every streamed layer passes through.
  if (!s->streamed_.empty()) {
    s->slots_.resize(size_t(n_slots));
    for (int k = 0; k < n_slots; ++k) {
      s->slot_lanes_.push_back("disk slot " + std::to_string(k));
      s->slots_[size_t(k)].base = s->slot_pool_.get() + uint64_t(k) * slot_bytes;
      s->slots_[size_t(k)].tickets.reserve(max_runs);
    }
    s->slot_views_.resize(s->streamed_.size() * size_t(n_slots));
    for (size_t j = 0; j < s->streamed_.size(); ++j) {
      const size_t l = size_t(s->streamed_[j]);
      const UnitLayout& u = s->layout_.layers[l];
      for (int k = 0; k < n_slots; ++k) {
        model::LayerWeights& v = s->slot_views_[j * size_t(n_slots) + size_t(k)];
        v = w.layers[l];
        SLUICE_RETURN_IF_ERROR(relocate_layer(v, file, u, u.runs, s->slots_[size_t(k)].base, s->pack_pool_.get()));
      }
    }
    // Fill the ring: the first n_slots streamed layers of the first pass are read during start-up.
    for (int k = 0; k < n_slots; ++k) SLUICE_RETURN_IF_ERROR(s->submit_next());
  }
  return s;
}

Status CpuLayerStreamer::pack_from_file(const PackedTensor& p, uint8_t* dst, uint8_t* staging, uint64_t staging_bytes) {
  const int64_t g = quant::kernels(p.shape.type).packed_rows;
  const int64_t rb = p.shape.row_bytes();
  backend::WeightView group = p.shape;
  group.ne1 = g;
  const int64_t group_bytes = be_->repacked_bytes(group);
  // An aligned read of n rows spans at most n * rb + 2 * kIoAlign bytes.
  const int64_t chunk = staging_bytes > 2 * kIoAlign ? int64_t(staging_bytes - 2 * kIoAlign) / rb / g * g : 0;
  if (g <= 0 || group_bytes <= 0 || chunk < g || p.shape.ne1 % g != 0) {
    return internal_error("stream: cannot repack " + p.name + " through a staging buffer of " +
                          format_bytes(staging_bytes));
  }
  for (int64_t a = 0; a < p.shape.ne1; a += chunk) {
    const int64_t n = std::min(chunk, p.shape.ne1 - a);
    const uint64_t off = p.offset + uint64_t(a * rb);
    const AlignedRange r = align_range(off, uint64_t(n * rb));
    SLUICE_CHECK(r.len <= staging_bytes, "stream: repack chunk larger than its staging");
    SLUICE_ASSIGN_OR_RETURN(FileReader::Ticket t, reader_->submit(p.file, r.offset, r.len, staging));
    SLUICE_RETURN_IF_ERROR(reader_->wait(t));
    backend::WeightView v = p.shape;
    v.ne1 = n;
    v.data = staging + (off - r.offset);
    be_->repack_weight(v, dst + a / g * group_bytes);
  }
  return Status::ok();
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
    auto t = reader_->submit(r.file, r.offset, r.len, slot.base + r.dst);
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
  if (skipped(layer)) {
    return invalid_argument("stream: layer " + std::to_string(layer) +
                            " is left out of every pass (--skip-layers): its weights were never loaded");
  }
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
  // The layer's matrices into the backend's layout (no-op when it computes on the file's), on
  // the compute thread while the reads of the next layers continue.
  const UnitLayout& u = layout_.layers[size_t(layer)];
  if (!u.packed.empty()) {
    SLUICE_CHECK(!pack_in_use_, "stream: a streamed layer acquired before the previous one was released");
    pack_in_use_ = true;
    for (const PackedTensor& p : u.packed) {
      backend::WeightView v = p.shape;
      v.data = slot.base + p.src;
      be_->repack_weight(v, pack_pool_.get() + p.dst);
    }
    const double packed_s = std::chrono::duration<double>(FileReader::Clock::now() - t1).count();
    stats_.repack_seconds += packed_s;
    stats_.repack_bytes += u.packed_bytes;
    if (decode_pass_) {
      stats_.decode_repack_seconds += packed_s;
      stats_.decode_repack_bytes += u.packed_bytes;
    }
  }
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
  pack_in_use_ = false;
  ++next_seq_;
  // The freed slot takes the layer n_slots ahead (wrapping into the next pass).
  if (failed_.is_ok()) (void)submit_next();
}

bool CpuLayerStreamer::can_skip(const std::vector<bool>& run) const {
  size_t skipped = 0;
  for (int l : streamed_) skipped += size_t(l) < run.size() && !run[size_t(l)];
  return skipped == 0 || skipped == streamed_.size();
}

bool CpuLayerStreamer::resident(int layer) const {
  return layer >= 0 && size_t(layer) < stream_index_.size() && stream_index_[size_t(layer)] < 0;
}

std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&, backend::Backend&)>
cpu_streaming_source(const std::string& path, const CpuStreamOptions& opts, CpuLayerStreamer** out) {
  return [path, opts, out](const gguf::File& file, const model::Weights& w,
                           backend::Backend& be) -> Result<std::unique_ptr<model::LayerSource>> {
    if (!be.reads_host_weights()) {
      return unsupported(std::string("CPU streaming computes on host memory; the ") + be.name() +
                         " backend cannot use it (use --backend cpu)");
    }
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<CpuLayerStreamer> s, CpuLayerStreamer::create(path, file, w, be, opts));
    if (out) *out = s.get();
    return std::unique_ptr<model::LayerSource>(std::move(s));
  };
}

}  // namespace sluice::stream
