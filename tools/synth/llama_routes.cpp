// Records the experts llama.cpp's own forward pass selects (the ffn_moe_topk-<layer> tensors,
// through the scheduler's eval callback) for random token sequences, one line per (position,
// layer): "token layer e1 e2 ... ek". route_skew.py --llama-routes FILE compares them with the
// routing it predicts from the GGUF alone. Not part of the sluice build; built like
// tools/golden/llama_fixture.cpp against a static llama.cpp build:
//   libs=$(find BUILD -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
//   g++ -O2 -std=c++17 -ISRC/include -ISRC/ggml/include tools/synth/llama_routes.cpp \
//     -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl -o llama_routes
// usage: llama_routes MODEL N_SEQUENCES SEQ_LEN OUT.txt [SEED]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace {

struct Capture {
  std::vector<int32_t> tokens;  // the batch being decoded
  FILE* out = nullptr;
  size_t lines = 0;
};

bool on_tensor(ggml_tensor* t, bool ask, void* user) {
  const bool want = std::strncmp(t->name, "ffn_moe_topk-", 13) == 0;
  if (ask) return want;  // asking: do we want this tensor's data
  if (!want) return true;
  auto* cap = static_cast<Capture*>(user);
  const int layer = std::atoi(t->name + 13);
  const int64_t k = t->ne[0], n = t->ne[1];
  std::vector<char> host(ggml_nbytes(t));
  ggml_backend_tensor_get(t, host.data(), 0, host.size());
  // The last layer runs its FFN only for the positions whose logits are wanted (the last one).
  const int64_t first = int64_t(cap->tokens.size()) - n;
  for (int64_t i = 0; i < n && first >= 0; ++i) {
    std::fprintf(cap->out, "%d %d", cap->tokens[size_t(first + i)], layer);
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      std::memcpy(&e, host.data() + i * t->nb[1] + j * t->nb[0], sizeof e);
      std::fprintf(cap->out, " %d", e);
    }
    std::fputc('\n', cap->out);
    ++cap->lines;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL N_SEQUENCES SEQ_LEN OUT.txt [SEED]\n", argv[0]);
    return 2;
  }
  const int n_seq = std::atoi(argv[2]), seq_len = std::atoi(argv[3]);
  Capture cap;
  cap.out = std::fopen(argv[4], "w");
  if (!cap.out) return 1;
  std::mt19937 rng(argc > 5 ? unsigned(std::atoi(argv[5])) : 1u);

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(seq_len);
  cp.n_batch = cp.n_ubatch = uint32_t(seq_len);
  cp.cb_eval = on_tensor;
  cp.cb_eval_user_data = &cap;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  std::uniform_int_distribution<int> tok(0, n_vocab - 1);
  for (int s = 0; s < n_seq; ++s) {
    llama_memory_clear(llama_get_memory(ctx), true);
    cap.tokens.resize(size_t(seq_len));
    for (auto& t : cap.tokens) t = tok(rng);
    llama_batch batch = llama_batch_get_one(cap.tokens.data(), seq_len);
    if (llama_decode(ctx, batch) != 0) return 1;
  }
  std::fclose(cap.out);
  std::fprintf(stderr, "%zu (position, layer) routes written\n", cap.lines);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
