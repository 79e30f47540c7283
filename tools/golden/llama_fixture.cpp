// Golden-fixture generator: runs llama.cpp (the correctness oracle) on a GGUF model and writes
// what sluice's golden tests compare against. Not part of the sluice build: it links a
// llama.cpp CPU build (see make_fixtures.sh). For each prompt it records the prompt's token ids
// (llama.cpp tokenizer), the greedy continuation (flash attention off), at every generated
// position the top-8 token ids and logits and the top-2 gap, and the full logits at the first
// generated position.
//
// It also measures llama.cpp's own numerical noise: the same token sequence is evaluated again
// with flash attention on (a different but equally correct summation order and rounding of the
// attention), and for every position the largest |logit difference| over the top-8 ids is
// recorded as "self_noise". Two correct implementations can disagree on the greedy token where
// the top-2 gap is within that noise.
//
// With LLAMA_FIXTURE_NGL=N (N > 0; a llama.cpp build with a GPU backend) the greedy run and the
// flash-attention replay offload N layers to the GPU: the fixture then describes llama.cpp's GPU
// backend, for comparing sluice's CUDA backend with it. The noise recorded is then the larger of
// two of llama.cpp's own disagreements at each position: GPU flash attention on vs off
// ("fa_noise"), and its CPU backend (no offload, same tokens teacher-forced) vs its GPU backend
// ("backend_noise"): the GPU sums dot products in other orders and quantizes activations per 32
// values, so two correct implementations differ by that much there. "backend_agree" counts the
// positions where the CPU backend's teacher-forced top-1 equals the GPU's greedy token.
//
// usage: llama_fixture MODEL PROMPTS.txt N_GEN OUT.json OUT_LOGITS.f32
//   PROMPTS.txt: one prompt per line; "\n" inside a line stands for a newline.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

// Logits of `ctx` at every generated position for the sequence prompt + gen[0..n-2] fed as one
// batch (teacher forcing); for each position, the largest |difference| from `top8` over its ids;
// `agree`: the positions whose top-1 is gen's token.
bool replay_noise(llama_context* ctx, int n_vocab, const std::vector<llama_token>& ids, const std::vector<llama_token>& gen,
                  const std::vector<std::vector<std::pair<int, float>>>& top8, std::vector<float>& noise, int& agree) {
  noise.assign(gen.size(), 0.0f);
  agree = 0;
  llama_memory_clear(llama_get_memory(ctx), true);
  std::vector<llama_token> seq = ids;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  llama_batch b = llama_batch_init(int(seq.size()), 0, 1);
  for (size_t i = 0; i < seq.size(); ++i) {
    b.token[i] = seq[i];
    b.pos[i] = int(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = i + 1 >= ids.size();
  }
  b.n_tokens = int(seq.size());
  const bool ok = llama_decode(ctx, b) == 0;
  if (ok) {
    for (size_t step = 0; step < gen.size(); ++step) {
      const float* lf = llama_get_logits_ith(ctx, int(ids.size() - 1 + step));
      for (const auto& [id, v] : top8[step]) noise[step] = std::max(noise[step], std::fabs(lf[id] - v));
      agree += std::max_element(lf, lf + n_vocab) - lf == gen[step];
    }
  }
  llama_batch_free(b);
  return ok;
}

void write_floats(std::FILE* js, const char* key, const std::vector<float>& v) {
  std::fprintf(js, "],\n     \"%s\": [", key);
  for (size_t i = 0; i < v.size(); ++i) std::fprintf(js, "%s%.6g", i ? ", " : "", v[i]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL PROMPTS.txt N_GEN OUT.json OUT_LOGITS.f32\n", argv[0]);
    return 2;
  }
  const char* model_path = argv[1];
  const int n_gen = std::atoi(argv[3]);
  std::vector<std::string> prompts;
  {
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) prompts.push_back(unescape(line));
    }
  }
  const char* ngl_env = std::getenv("LLAMA_FIXTURE_NGL");
  const int ngl = ngl_env ? std::atoi(ngl_env) : 0;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = ngl;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  // The CPU model sees no GPU at all (an empty device list), and its context offloads no op.
  llama_model_params mp_cpu = mp;
  mp_cpu.n_gpu_layers = 0;
  ggml_backend_dev_t no_devices[1] = {nullptr};
  mp_cpu.devices = no_devices;
  llama_model* model_cpu = ngl > 0 ? llama_model_load_from_file(model_path, mp_cpu) : nullptr;
  if (!model || (ngl > 0 && !model_cpu)) {
    std::fprintf(stderr, "cannot load %s\n", model_path);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = 1024;
  cp.n_ubatch = 1024;
  cp.n_threads = 2;
  cp.n_threads_batch = 2;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  llama_context_params cp_fa = cp;
  cp_fa.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  llama_context* ctx_fa = llama_init_from_model(model, cp_fa);
  llama_context_params cp_cpu = cp;
  cp_cpu.offload_kqv = false;
  cp_cpu.op_offload = false;
  llama_context* ctx_cpu = model_cpu ? llama_init_from_model(model_cpu, cp_cpu) : nullptr;
  if (!ctx || !ctx_fa || (model_cpu && !ctx_cpu)) {
    std::fprintf(stderr, "cannot create context\n");
    return 1;
  }

  std::FILE* logits_out = std::fopen(argv[5], "wb");
  std::FILE* js = std::fopen(argv[4], "w");
  if (!logits_out || !js) {
    std::fprintf(stderr, "cannot open outputs\n");
    return 1;
  }
  std::fprintf(js, "{\n  \"model\": \"%s\",\n  \"n_vocab\": %d,\n  \"n_gen\": %d,\n  \"flash_attn\": false,\n  \"backend\": \"%s\",\n  \"n_gpu_layers\": %d,\n  \"cases\": [\n",
               json_escape(model_path).c_str(), n_vocab, n_gen, ngl > 0 ? "gpu" : "cpu", ngl);
  for (size_t p = 0; p < prompts.size(); ++p) {
    llama_memory_clear(llama_get_memory(ctx), true);
    std::vector<llama_token> ids(prompts[p].size() + 16);
    int n = llama_tokenize(vocab, prompts[p].c_str(), int(prompts[p].size()), ids.data(), int(ids.size()), true, true);
    if (n < 0) {
      std::fprintf(stderr, "tokenize failed\n");
      return 1;
    }
    ids.resize(n);
    std::vector<llama_token> gen;
    std::vector<float> gaps;
    std::vector<std::vector<std::pair<int, float>>> top8;
    llama_batch batch = llama_batch_get_one(ids.data(), int(ids.size()));
    for (int step = 0; step < n_gen; ++step) {
      if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "decode failed\n");
        return 1;
      }
      const float* logits = llama_get_logits_ith(ctx, -1);
      if (step == 0) std::fwrite(logits, sizeof(float), n_vocab, logits_out);
      int best = 0, second = -1;
      for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
          second = best;
          best = i;
        } else if (second < 0 || logits[i] > logits[second]) {
          second = i;
        }
      }
      gen.push_back(best);
      gaps.push_back(logits[best] - logits[second]);
      std::vector<int> order(n_vocab);
      for (int i = 0; i < n_vocab; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 8, order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
      std::vector<std::pair<int, float>> t8;
      for (int i = 0; i < 8; ++i) t8.push_back({order[i], logits[order[i]]});
      top8.push_back(t8);
      batch = llama_batch_get_one(&gen.back(), 1);
    }
    // Teacher-forced replays: flash attention on (and, with offload, the CPU backend).
    std::vector<float> fa_noise, backend_noise;
    int fa_agree = 0, backend_agree = 0;
    if (!replay_noise(ctx_fa, n_vocab, ids, gen, top8, fa_noise, fa_agree) ||
        (ctx_cpu && !replay_noise(ctx_cpu, n_vocab, ids, gen, top8, backend_noise, backend_agree))) {
      std::fprintf(stderr, "decode (teacher-forced replay) failed\n");
      return 1;
    }
    std::vector<float> noise = fa_noise;
    for (size_t i = 0; i < backend_noise.size(); ++i) noise[i] = std::max(noise[i], backend_noise[i]);
    std::fprintf(js, "    {\"prompt\": \"%s\",\n     \"prompt_ids\": [", json_escape(prompts[p]).c_str());
    for (size_t i = 0; i < ids.size(); ++i) std::fprintf(js, "%s%d", i ? ", " : "", ids[i]);
    std::fprintf(js, "],\n     \"tokens\": [");
    for (size_t i = 0; i < gen.size(); ++i) std::fprintf(js, "%s%d", i ? ", " : "", gen[i]);
    std::fprintf(js, "],\n     \"top2_gap\": [");
    for (size_t i = 0; i < gaps.size(); ++i) std::fprintf(js, "%s%.6g", i ? ", " : "", gaps[i]);
    write_floats(js, "self_noise", noise);
    if (ctx_cpu) {
      write_floats(js, "fa_noise", fa_noise);
      write_floats(js, "backend_noise", backend_noise);
      std::fprintf(js, "],\n     \"backend_agree\": %d", backend_agree);
      std::fprintf(js, ",\n     \"top8\": [");
    } else {
      std::fprintf(js, "],\n     \"top8\": [");
    }
    for (size_t i = 0; i < top8.size(); ++i) {
      std::fprintf(js, "%s[", i ? ", " : "");
      for (size_t k = 0; k < top8[i].size(); ++k) std::fprintf(js, "%s[%d, %.6g]", k ? ", " : "", top8[i][k].first, top8[i][k].second);
      std::fprintf(js, "]");
    }
    std::fprintf(js, "]}%s\n", p + 1 < prompts.size() ? "," : "");
  }
  std::fprintf(js, "  ]\n}\n");
  std::fclose(js);
  std::fclose(logits_out);
  llama_free(ctx);
  llama_free(ctx_fa);
  if (ctx_cpu) llama_free(ctx_cpu);
  if (model_cpu) llama_model_free(model_cpu);
  llama_model_free(model);
  return 0;
}
