#include "app/inspect.h"

#include <cinttypes>
#include <cstdio>

namespace sluice::app {

namespace {

constexpr size_t kMaxShownString = 60;
constexpr size_t kMaxShownItems = 4;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string mib(uint64_t bytes) { return format("%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < kMaxShownString; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c < 0x20) out += "?";
    else out += static_cast<char>(c);
  }
  if (s.size() > kMaxShownString) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}

}  // namespace

std::string render_value(const gguf::Value& v) {
  using gguf::ValueType;
  if (v.is_unsigned()) return std::to_string(v.u);
  if (v.is_signed()) return std::to_string(v.i);
  if (v.is_float()) return format("%.9g", v.f);
  switch (v.type) {
    case ValueType::kBool: return v.u ? "true" : "false";
    case ValueType::kString: return quote(v.s);
    case ValueType::kArray: {
      std::string s = "[" + std::to_string(v.items.size()) + " x " + gguf::value_type_name(v.elem_type) + "]";
      if (!v.items.empty()) {
        s += " ";
        for (size_t i = 0; i < v.items.size() && i < kMaxShownItems; ++i) s += (i ? ", " : "") + render_value(v.items[i]);
        if (v.items.size() > kMaxShownItems) s += ", ...";
      }
      return s;
    }
    default: return "?";
  }
}

TensorRole tensor_role(const std::string& name) {
  TensorRole r;
  auto base = name;
  for (const char* suffix : {".weight", ".bias"}) {
    const std::string sfx = suffix;
    if (base.size() > sfx.size() && base.compare(base.size() - sfx.size(), sfx.size(), sfx) == 0) {
      base.resize(base.size() - sfx.size());
      break;
    }
  }
  if (base.rfind("blk.", 0) != 0) {
    for (const char* known : {"token_embd", "output", "output_norm", "rope_freqs"}) {
      if (base == known) {
        r.role = known;
        return r;
      }
    }
    r.role = "other";
    return r;
  }
  const size_t dot = base.find('.', 4);
  const std::string num = base.substr(4, dot == std::string::npos ? std::string::npos : dot - 4);
  if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos ||
      dot == std::string::npos) {
    r.role = "other";
    return r;
  }
  r.layer = std::stoi(num);
  const std::string part = base.substr(dot + 1);
  auto ends_with = [&](const char* s) {
    const std::string x = s;
    return part.size() >= x.size() && part.compare(part.size() - x.size(), x.size(), x) == 0;
  };
  if (part.find("exps") != std::string::npos || part.find("shexp") != std::string::npos || part == "ffn_gate_inp" ||
      part == "exp_probs_b") {
    r.role = "experts";
  } else if (ends_with("norm")) {
    r.role = "norms";
  } else {
    for (const char* known : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      if (part == known) {
        r.role = known;
        return r;
      }
    }
    r.role = "other";
  }
  return r;
}

InspectReport make_report(const gguf::File& file) {
  InspectReport rep;
  rep.path = file.path();
  rep.version = file.version();
  rep.file_bytes = file.file_size();
  rep.alignment = file.alignment();
  rep.data_offset = file.data_offset();
  rep.shards = file.shards();
  if (auto a = file.get_string("general.architecture"); a.is_ok()) rep.architecture = a.value();
  const std::string prefix = rep.architecture.empty() ? std::string("\x01") : rep.architecture + ".";
  for (const auto& kv : file.metadata()) {
    if (kv.key.rfind(prefix, 0) == 0) rep.hparams.emplace_back(kv.key.substr(prefix.size()), render_value(kv.value));
    if (kv.key.rfind("general.", 0) == 0) rep.general.emplace_back(kv.key.substr(8), render_value(kv.value));
  }
  if (auto m = file.get_string("tokenizer.ggml.model"); m.is_ok()) rep.tokenizer_model = m.value();
  if (auto p = file.get_string("tokenizer.ggml.pre"); p.is_ok()) rep.tokenizer_pre = p.value();
  if (const auto* t = file.find("tokenizer.ggml.tokens"); t && t->type == gguf::ValueType::kArray) {
    rep.vocab_size = t->items.size();
  }
  if (const auto* m = file.find("tokenizer.ggml.merges"); m && m->type == gguf::ValueType::kArray) {
    rep.n_merges = m->items.size();
  }
  std::map<int, LayerBytes> layers;
  for (const auto& t : file.tensors()) {
    rep.tensors.push_back(&t);
    rep.tensor_bytes += t.nbytes;
    rep.by_type[quant::type_name(t.type)] += t.nbytes;
    const TensorRole role = tensor_role(t.name);
    if (role.layer < 0) {
      rep.non_layer[role.role] += t.nbytes;
    } else {
      LayerBytes& l = layers[role.layer];
      l.layer = role.layer;
      l.total += t.nbytes;
      l.by_role[role.role] += t.nbytes;
    }
  }
  for (auto& [i, l] : layers) rep.layers.push_back(std::move(l));
  return rep;
}

std::string render_text(const InspectReport& rep) {
  std::string out;
  char line[512];
  auto add = [&](const std::string& s) { out += s + "\n"; };
  add(rep.path + ": GGUF v" + std::to_string(rep.version) + ", " + std::to_string(rep.file_bytes) + " bytes (" +
      mib(rep.file_bytes) + " MiB), alignment " + std::to_string(rep.alignment) + ", data at " +
      std::to_string(rep.data_offset));
  const bool split = rep.shards.size() > 1;
  if (split) {
    uint64_t total = 0;
    for (const auto& sh : rep.shards) total += sh.size;
    add("split: " + std::to_string(rep.shards.size()) + " shards (gguf-split), " + std::to_string(total) + " bytes (" +
        mib(total) + " MiB) in all; tensor offsets below are relative to their shard's data section");
    std::snprintf(line, sizeof line, "  %5s %14s %8s %9s %12s  %s", "shard", "bytes", "tensors", "alignment",
                  "data at", "path");
    add(line);
    for (size_t k = 0; k < rep.shards.size(); ++k) {
      const auto& sh = rep.shards[k];
      std::snprintf(line, sizeof line, "  %5zu %14" PRIu64 " %8" PRIu64 " %9" PRIu64 " %12" PRIu64 "  %s", k + 1,
                    sh.size, sh.n_tensors, sh.alignment, sh.data_offset, sh.path.c_str());
      add(line);
    }
  }
  add("architecture: " + (rep.architecture.empty() ? std::string("(missing general.architecture)") : rep.architecture));
  for (const auto& [k, v] : rep.hparams) add("  " + k + " = " + v);
  add("general:");
  for (const auto& [k, v] : rep.general) add("  " + k + " = " + v);
  add("tokenizer: model " + (rep.tokenizer_model.empty() ? "-" : rep.tokenizer_model) + ", pre " +
      (rep.tokenizer_pre.empty() ? "-" : rep.tokenizer_pre) + ", vocab " + std::to_string(rep.vocab_size) +
      ", merges " + std::to_string(rep.n_merges));

  add("");
  add("tensors: " + std::to_string(rep.tensors.size()) + ", " + std::to_string(rep.tensor_bytes) + " bytes (" +
      mib(rep.tensor_bytes) + " MiB)");
  std::snprintf(line, sizeof line, "  %-40s %-6s %-28s %14s %14s%s", "name", "type", "shape", "bytes", "offset",
                split ? "  shard" : "");
  add(line);
  for (const auto* t : rep.tensors) {
    std::snprintf(line, sizeof line, "  %-40s %-6s %-28s %14" PRIu64 " %14" PRIu64, t->name.c_str(),
                  quant::type_name(t->type), gguf::shape_string(t->shape).c_str(), t->nbytes, t->offset);
    std::string row = line;
    if (split) row += "  " + std::to_string(t->shard + 1);
    add(row);
  }
  add("");
  add("bytes by type:");
  for (const auto& [type, bytes] : rep.by_type) add("  " + type + ": " + std::to_string(bytes) + " (" + mib(bytes) + " MiB)");
  add("non-layer tensors:");
  for (const auto& [role, bytes] : rep.non_layer) add("  " + role + ": " + std::to_string(bytes) + " (" + mib(bytes) + " MiB)");

  if (!rep.layers.empty()) {
    static const char* const kCols[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                        "ffn_down", "norms", "experts", "other"};
    add("");
    add("per-layer MiB:");
    std::string hdr = "  layer      total";
    for (const char* c : kCols) {
      std::snprintf(line, sizeof line, " %11s", c);
      hdr += line;
    }
    add(hdr);
    for (const auto& l : rep.layers) {
      std::snprintf(line, sizeof line, "  %5d %10s", l.layer, mib(l.total).c_str());
      std::string row = line;
      for (const char* c : kCols) {
        auto it = l.by_role.find(c);
        std::snprintf(line, sizeof line, " %11s", it == l.by_role.end() ? "-" : mib(it->second).c_str());
        row += line;
      }
      add(row);
    }
  }
  return out;
}

nlohmann::json render_json(const InspectReport& rep) {
  using nlohmann::json;
  json j;
  j["path"] = rep.path;
  j["version"] = rep.version;
  j["file_bytes"] = rep.file_bytes;
  j["alignment"] = rep.alignment;
  j["data_offset"] = rep.data_offset;
  json shards = json::array();
  for (const auto& sh : rep.shards) {
    shards.push_back({{"path", sh.path}, {"version", sh.version}, {"file_bytes", sh.size},
                      {"alignment", sh.alignment}, {"data_offset", sh.data_offset}, {"tensors", sh.n_tensors}});
  }
  j["shards"] = shards;
  j["architecture"] = rep.architecture;
  json hp = json::object();
  for (const auto& [k, v] : rep.hparams) hp[k] = v;
  j["hparams"] = hp;
  json gen = json::object();
  for (const auto& [k, v] : rep.general) gen[k] = v;
  j["general"] = gen;
  j["tokenizer"] = {{"model", rep.tokenizer_model}, {"pre", rep.tokenizer_pre}, {"vocab_size", rep.vocab_size},
                    {"merges", rep.n_merges}};
  json ts = json::array();
  for (const auto* t : rep.tensors) {
    ts.push_back({{"name", t->name}, {"type", quant::type_name(t->type)}, {"shape", t->shape},
                  {"bytes", t->nbytes}, {"offset", t->offset}, {"shard", t->shard}});
  }
  j["tensors"] = ts;
  j["tensor_bytes"] = rep.tensor_bytes;
  j["bytes_by_type"] = rep.by_type;
  j["non_layer_bytes"] = rep.non_layer;
  json ls = json::array();
  for (const auto& l : rep.layers) ls.push_back({{"layer", l.layer}, {"bytes", l.total}, {"by_role", l.by_role}});
  j["layers"] = ls;
  return j;
}

}  // namespace sluice::app
