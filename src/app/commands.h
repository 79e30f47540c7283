// Subcommands of the `sluice` executable. Each returns the process exit code:
// 0 success, 2 bad input (with a message naming what is wrong on stderr), 1 other failure.
#pragma once

namespace sluice::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

int cmd_run(int argc, char** argv);         // generate text from a prompt
int cmd_chat(int argc, char** argv);        // interactive chat, KV cache kept across turns
int cmd_perplexity(int argc, char** argv);  // perplexity over a text file
int cmd_inspect(int argc, char** argv);     // describe a GGUF file
int cmd_synth(int argc, char** argv);       // write a random-but-valid GGUF of a named shape
int cmd_bench(int argc, char** argv);       // prefill/decode throughput table
int cmd_calibrate(int argc, char** argv);   // layer-skip scores and their perplexity cost
int cmd_serve(int argc, char** argv);       // OpenAI-compatible HTTP server

}  // namespace sluice::app
