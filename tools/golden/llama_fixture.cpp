// Golden-fixture generator: runs llama.cpp (the correctness oracle) on a GGUF model and writes
// what sluice's golden tests compare against. Not part of the sluice build: it links a
// llama.cpp CPU build (see make_fixtures.sh). For each prompt it records the prompt's token ids
// (llama.cpp tokenizer), the greedy continuation, the top-2 logit gap at every generated
// position (to tell near-ties from bugs), and the full logits at the first generated position.
//
// usage: llama_fixture MODEL PROMPTS.txt N_GEN OUT.json OUT_LOGITS.f32
//   PROMPTS.txt: one prompt per line; "\n" inside a line stands for a newline.
#include <cmath>
#include <cstdio>
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
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (!model) {
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
  if (!ctx) {
    std::fprintf(stderr, "cannot create context\n");
    return 1;
  }

  std::FILE* logits_out = std::fopen(argv[5], "wb");
  std::FILE* js = std::fopen(argv[4], "w");
  if (!logits_out || !js) {
    std::fprintf(stderr, "cannot open outputs\n");
    return 1;
  }
  std::fprintf(js, "{\n  \"model\": \"%s\",\n  \"n_vocab\": %d,\n  \"n_gen\": %d,\n  \"flash_attn\": false,\n  \"cases\": [\n",
               json_escape(model_path).c_str(), n_vocab, n_gen);
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
      batch = llama_batch_get_one(&gen.back(), 1);
    }
    std::fprintf(js, "    {\"prompt\": \"%s\",\n     \"prompt_ids\": [", json_escape(prompts[p]).c_str());
    for (size_t i = 0; i < ids.size(); ++i) std::fprintf(js, "%s%d", i ? ", " : "", ids[i]);
    std::fprintf(js, "],\n     \"tokens\": [");
    for (size_t i = 0; i < gen.size(); ++i) std::fprintf(js, "%s%d", i ? ", " : "", gen[i]);
    std::fprintf(js, "],\n     \"top2_gap\": [");
    for (size_t i = 0; i < gaps.size(); ++i) std::fprintf(js, "%s%.6g", i ? ", " : "", gaps[i]);
    std::fprintf(js, "]}%s\n", p + 1 < prompts.size() ? "," : "");
  }
  std::fprintf(js, "  ]\n}\n");
  std::fclose(js);
  std::fclose(logits_out);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
