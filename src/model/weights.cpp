#include "model/weights.h"

#include <algorithm>
#include <string>

#include "gguf/gguf.h"

namespace sluice::model {
namespace {

// What a tensor is used for decides which formats it may have.
enum class Use {
  kMatrix,  // multiplied by activations: any format with a vec_dot
  kTable,   // rows looked up (token_embd): any format with dequantize; also a matrix when tied
  kVector,  // norms, biases, rope factors: f32 (the elementwise ops read it directly)
};

std::string shape_str(int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
  std::vector<uint64_t> shape{uint64_t(ne0)};
  if (ne1 != 1 || ne2 != 1) shape.push_back(uint64_t(ne1));
  if (ne2 != 1) shape.push_back(uint64_t(ne2));
  return gguf::shape_string(shape);
}

// Finds `name` and checks it against the expected shape [ne0, ne1, ne2] and its use. When the
// tensor is absent: error if required, else an empty TensorRef.
Result<TensorRef> resolve(const gguf::File& f, const std::string& name, int64_t ne0, int64_t ne1, Use use,
                          bool required, int64_t ne2 = 1) {
  const gguf::TensorInfo* info = f.find_tensor(name);
  if (!info) {
    if (!required) return TensorRef{};
    return invalid_argument(f.path() + ": missing tensor " + name + " (expected shape " + shape_str(ne0, ne1, ne2) +
                            ")");
  }
  // Trailing dimensions of 1 are insignificant ([576] == [576, 1]).
  auto dim = [&](size_t d) { return d < info->shape.size() ? int64_t(info->shape[d]) : int64_t{1}; };
  bool ok = info->shape.size() >= 1 && dim(0) == ne0 && dim(1) == ne1 && dim(2) == ne2;
  for (size_t d = 3; d < info->shape.size(); ++d) ok = ok && info->shape[d] == 1;
  if (!ok) {
    return invalid_argument(f.path() + ": tensor " + name + " has shape " + gguf::shape_string(info->shape) +
                            ", expected " + shape_str(ne0, ne1, ne2));
  }
  const quant::Kernels& k = quant::kernels(info->type);
  const char* tn = quant::type_name(info->type);
  switch (use) {
    case Use::kMatrix:
      if (!k.vec_dot) {
        return unsupported(f.path() + ": tensor " + name + " has type " + tn +
                           ", which has no matrix-product kernel (expected a weight format such as q4_k, q8_0, f16)");
      }
      break;
    case Use::kTable:
      if (!k.dequantize_row) return unsupported(f.path() + ": tensor " + name + " has type " + tn + ", which cannot be dequantized");
      break;
    case Use::kVector:
      if (info->type != quant::Type::kF32) {
        return unsupported(f.path() + ": tensor " + name + " has type " + tn + ", expected f32");
      }
      break;
  }
  TensorRef r;
  r.name = name;
  r.type = info->type;
  r.ne0 = ne0;
  r.ne1 = ne1;
  r.ne2 = ne2;
  r.data = f.tensor_data(*info);
  r.nbytes = info->nbytes;
  return r;
}

struct LayerSlot {
  TensorRef LayerWeights::*field;
  int64_t ne0, ne1;
  Use use;
  int64_t ne2 = 1;
};

LayerSlot layer_slot(LayerTensor t, const Config& c) {
  using LT = LayerTensor;
  switch (t) {
    case LT::kAttnNorm: return {&LayerWeights::attn_norm, c.n_embd, 1, Use::kVector};
    case LT::kWq: return {&LayerWeights::wq, c.n_embd, c.n_embd_q(), Use::kMatrix};
    case LT::kWk: return {&LayerWeights::wk, c.n_embd, c.n_embd_k(), Use::kMatrix};
    case LT::kWv: return {&LayerWeights::wv, c.n_embd, c.n_embd_v(), Use::kMatrix};
    case LT::kWo: return {&LayerWeights::wo, c.n_head * c.head_dim_v, c.n_embd, Use::kMatrix};
    case LT::kBq: return {&LayerWeights::bq, c.n_embd_q(), 1, Use::kVector};
    case LT::kBk: return {&LayerWeights::bk, c.n_embd_k(), 1, Use::kVector};
    case LT::kBv: return {&LayerWeights::bv, c.n_embd_v(), 1, Use::kVector};
    case LT::kQNorm: return {&LayerWeights::q_norm, c.head_dim, 1, Use::kVector};
    case LT::kKNorm: return {&LayerWeights::k_norm, c.head_dim, 1, Use::kVector};
    case LT::kFfnNorm: return {&LayerWeights::ffn_norm, c.n_embd, 1, Use::kVector};
    case LT::kWGate: return {&LayerWeights::w_gate, c.n_embd, c.n_ff, Use::kMatrix};
    case LT::kWUp: return {&LayerWeights::w_up, c.n_embd, c.n_ff, Use::kMatrix};
    case LT::kWDown: return {&LayerWeights::w_down, c.n_ff, c.n_embd, Use::kMatrix};
    case LT::kGateInp: return {&LayerWeights::gate_inp, c.n_embd, c.n_expert, Use::kMatrix};
    case LT::kGateExps: return {&LayerWeights::gate_exps, c.n_embd, c.n_ff_exp, Use::kMatrix, c.n_expert};
    case LT::kUpExps: return {&LayerWeights::up_exps, c.n_embd, c.n_ff_exp, Use::kMatrix, c.n_expert};
    case LT::kDownExps: return {&LayerWeights::down_exps, c.n_ff_exp, c.n_embd, Use::kMatrix, c.n_expert};
    case LT::kGateInpSh: return {&LayerWeights::gate_inp_shexp, c.n_embd, 1, Use::kMatrix};
    case LT::kGateSh: return {&LayerWeights::gate_shexp, c.n_embd, c.n_ff_shexp, Use::kMatrix};
    case LT::kUpSh: return {&LayerWeights::up_shexp, c.n_embd, c.n_ff_shexp, Use::kMatrix};
    case LT::kDownSh: return {&LayerWeights::down_shexp, c.n_ff_shexp, c.n_embd, Use::kMatrix};
    case LT::kPostAttnNorm: return {&LayerWeights::post_attn_norm, c.n_embd, 1, Use::kVector};
    case LT::kPostFfnNorm: return {&LayerWeights::post_ffn_norm, c.n_embd, 1, Use::kVector};
  }
  SLUICE_CHECK(false, "unknown layer tensor");
  return {};
}

}  // namespace

int64_t repacked_bytes(const backend::Backend& be, const TensorRef& t) {
  if (!t.present()) return 0;
  const int group = quant::kernels(t.type).packed_rows;
  if (t.ne2 > 1 && (group <= 0 || t.ne1 % group != 0)) return 0;
  return std::max<int64_t>(be.repacked_bytes(t.view()), 0);
}

uint64_t Weights::layer_bytes_per_token(size_t layer) const {
  const LayerWeights& l = layers[layer];
  uint64_t b = 0;
  for (const TensorRef* t : l.tensors()) b += t->nbytes;
  if (n_expert > 0) b -= l.expert_bytes() - l.expert_bytes() / uint64_t(n_expert) * uint64_t(n_expert_used);
  return b;
}

uint64_t Weights::bytes_per_token() const {
  uint64_t b = output_norm.nbytes + output.nbytes + rope_freqs.nbytes;
  if (token_embd.ne1 > 0) b += token_embd.nbytes / uint64_t(token_embd.ne1);
  for (size_t l = 0; l < layers.size(); ++l) b += layer_bytes_per_token(l);
  return b;
}

uint64_t Weights::bytes_total() const {
  uint64_t b = token_embd.nbytes + output_norm.nbytes + rope_freqs.nbytes;
  if (output.data != token_embd.data) b += output.nbytes;
  for (const auto& l : layers)
    for (const TensorRef* t : l.tensors()) b += t->nbytes;
  return b;
}

Result<Weights> load_weights(const gguf::File& file, const ArchSpec& arch, const Config& cfg) {
  Weights w;
  SLUICE_ASSIGN_OR_RETURN(w.token_embd, resolve(file, "token_embd.weight", cfg.n_embd, cfg.n_vocab, Use::kTable, true));
  SLUICE_ASSIGN_OR_RETURN(w.output_norm, resolve(file, "output_norm.weight", cfg.n_embd, 1, Use::kVector, true));
  SLUICE_ASSIGN_OR_RETURN(w.output, resolve(file, "output.weight", cfg.n_embd, cfg.n_vocab, Use::kMatrix, false));
  if (!w.output.present()) {
    // Tied embeddings: the output projection is token_embd, so it must also be a matrix format.
    SLUICE_ASSIGN_OR_RETURN(w.output, resolve(file, "token_embd.weight", cfg.n_embd, cfg.n_vocab, Use::kMatrix, true));
  }
  SLUICE_ASSIGN_OR_RETURN(w.rope_freqs, resolve(file, "rope_freqs.weight", cfg.n_rot / 2, 1, Use::kVector, false));
  w.layers.resize(size_t(cfg.n_layer));
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string prefix = "blk." + std::to_string(i) + ".";
    for (auto specs : {arch.layer_tensors, cfg.moe() ? arch.moe_ffn : arch.dense_ffn}) {
      for (const LayerTensorSpec& spec : specs) {
        const LayerSlot s = layer_slot(spec.tensor, cfg);
        SLUICE_ASSIGN_OR_RETURN(w.layers[size_t(i)].*s.field,
                                resolve(file, prefix + layer_tensor_suffix(spec.tensor), s.ne0, s.ne1, s.use,
                                        spec.required, s.ne2));
      }
    }
  }
  w.n_expert = cfg.n_expert;
  w.n_expert_used = cfg.n_expert_used;
  return w;
}

}  // namespace sluice::model
