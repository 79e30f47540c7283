// What the model-driven subcommands share: opening a model with its tokenizer and chat
// template, mapping errors to exit codes, and the stats lines every run ends with.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "app/options.h"
#include "core/status.h"
#include "decode/generate.h"
#include "gguf/gguf.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "stream/cpu_streamer.h"
#include "stream/device_streamer.h"
#include "stream/expert_streamer.h"
#include "stream/probe.h"
#include "stream/ram_expert_cache.h"
#include "stream/trace.h"

namespace sluice::app {

// 2 for errors caused by what the user gave us (flags, files, prompts), 1 otherwise.
int exit_code_for(const Status& st);
// Prints "sluice <command>: <message>" to stderr and returns exit_code_for(st).
int report_error(std::string_view command, const Status& st);

// The GGUF's metadata and tokenizer: cheap (header only), so prompts can be checked before
// the weights are loaded.
struct ModelMeta {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<model::Tokenizer> tokenizer;
};
// Errors name the path: missing file, not a GGUF, corrupt, unsupported tokenizer.
Result<ModelMeta> open_model_meta(const std::string& path);

// Loads the weights; `seconds` receives the wall time taken.
Result<std::unique_ptr<model::Model>> load_weights(const ModelFlags& f, double& seconds);

// Checks the stream flags before anything is loaded: --ram-budget and --vram-budget parse (error
// names the flag), --trace comes with one of them. Returns the RAM budget, if any.
Result<std::optional<uint64_t>> resolve_stream_flags(const StreamFlags& sf);

// The streamed layers' ring slots: --slots when given, else the streamer's own default
// (CpuStreamOptions / DeviceStreamOptions::n_slots, 2), or kServerSlots for the device pipeline
// (`device`: --vram-budget, or a model larger than the GPU) when at least kServerSlotsSequences
// sequences share a pass. A pass of 32 sequences gives the CPU layers of ~23 ms each (70B),
// under which 2 slots let the copy engine fill only 2 layers (~10 ms each); a third lets it run
// ahead, so fewer layers need the CPU (measured on the H200 host, docs/SERVING.md).
inline constexpr int kServerSlots = 3, kServerSlotsSequences = 16;
int stream_slots(const StreamFlags& sf, int max_sequences, bool device);

// --plan: probes the disk (unless --no-probe), plans with --ram-budget (default: everything
// resident) and prints the plan to stdout.
Status print_plan(const ModelFlags& mf, const StreamFlags& sf, const gguf::File& file);

// What load_model does when loading the whole model on its backend failed with `failure`
// (`asked`: the --backend choice; `has_gpu`: a CUDA device is present; --backend auto loads on
// the GPU first when there is one): kDevicePipeline when the GPU is out of memory (streams layers
// through the GPU with its free memory as the VRAM budget; for auto, the CPU if that fails too),
// kCpu for auto when the GPU itself failed (kUnsupported, kInternal), kNone (the error stands)
// otherwise: errors of the file or the flags would stop the CPU too.
enum class LoadFallback { kNone, kDevicePipeline, kCpu };
LoadFallback after_whole_load(model::BackendKind asked, bool has_gpu, const Status& failure);

// A model loaded by the shared path: on the mmapped file, with --ram-budget through the CPU
// streamer (after the disk probe, writing --trace), or with --vram-budget (or --backend cuda or
// auto and a model larger than the GPU's free memory: after_whole_load) through the device
// pipeline on the CUDA backend.
struct LoadedModel {
  std::unique_ptr<stream::TraceWriter> trace;  // before model: the streamer appends until destroyed
  std::unique_ptr<model::Model> model;
  stream::CpuLayerStreamer* streamer = nullptr;  // owned by model; null without --ram-budget
  stream::DeviceStreamer* device_streamer = nullptr;  // owned by model; the device pipeline (--vram-budget)
  stream::ExpertStreamer* expert_streamer = nullptr;  // owned by model; MoE expert placement (--vram-budget)
  stream::RamExpertCache* ram_experts = nullptr;      // owned by model; MoE on the CPU with --ram-budget
  std::optional<stream::DiskProbe> probe;        // when streaming without --no-probe
  double load_s = 0;                              // wall time of the load (probe included)
};
Result<LoadedModel> load_model(const ModelFlags& mf, const StreamFlags& sf);

// After the run: the streaming stats lines (nothing without a streamer) and the trace flushed to
// its file (stats name it). `t` gives the decode rate; passes without decode (perplexity) are
// reported per pass. Error: the trace could not be written.
Status finish_stream(FILE* out, LoadedModel& lm, const decode::Timings& t);

// The model's chat template (tokenizer.chat_template), or the family named by `override_name`
// ("chatml", "llama3", ...) when non-empty. Error names the families on offer.
Result<model::ChatTemplate> chat_template_for(const gguf::File& file, const std::string& override_name);

// "llama 135M Q4_1"-style description, parameter count and tensor bytes, from the header.
struct ModelSummary {
  std::string description;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
};
ModelSummary summarize(const gguf::File& file);

// Final stats lines on stderr: load time, prefill and decode tok/s, weight GB/s per decoded
// token (weight bytes read per token x decode tok/s).
void print_stats(FILE* out, double load_s, const decode::Timings& t, uint64_t weight_bytes_per_token,
                 const char* backend);

// Adds b's counts and times to a (chat accumulates its turns).
void accumulate(decode::Timings& a, const decode::Timings& b);

// Generation callback that streams text to stdout as it is produced (flushed per piece).
bool print_to_stdout(std::string_view piece);

}  // namespace sluice::app
