// sluice serve -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY]: an
// OpenAI-compatible HTTP server over the continuous-batching scheduler (docs/SERVING.md).
//
// Signals: SIGTERM and SIGINT are blocked in every thread (before the model's and the server's
// threads start, which inherit the mask) and taken synchronously by one watcher thread with
// sigtimedwait, so there is no signal handler and no global state. On the signal the server stops
// accepting connections, lets running and queued requests finish for --shutdown-timeout seconds,
// cancels the rest and exits 0.
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "app/commands.h"
#include "app/common.h"
#include "backend/backend.h"
#include "model/arch.h"
#include "model/config.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"

namespace sluice::app {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible HTTP server with continuous batching", "sluice serve"};
  ModelFlags mf;
  SamplingFlags sf;
  StreamFlags stf;
  serve::ServerOptions so;
  serve::SchedulerOptions sched_opts;
  std::string template_name;
  int parallel = 4;
  int kv_positions = 0;
  double shutdown_timeout = 10;
  add_model_flags(app, mf);
  app.add_option("--host", so.host, "address to listen on (loopback by default; 0.0.0.0 for every interface)")
      ->capture_default_str();
  app.add_option("--port", so.port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--parallel", parallel, "requests generating at once (sequences in the batch)")
      ->check(CLI::Range(1, 512))
      ->capture_default_str();
  app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health and /");
  app.add_option("--kv-positions", kv_positions,
                 "KV cache pool in positions, shared by all requests (0: context x parallel)")
      ->check(CLI::Range(0, 1 << 26))
      ->capture_default_str();
  app.add_option("--queue", sched_opts.max_queue, "requests waiting for a slot beyond which the server answers 503")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  bool no_prompt_cache = false;
  app.add_flag("--no-prompt-cache", no_prompt_cache,
               "do not keep finished prompts' KV rows for later requests that start with the same tokens");
  app.add_option("--batch-tokens", sched_opts.step_tokens,
                 "tokens per batched pass: decode tokens plus prompt chunks (long prompts are prefilled in chunks); "
                 "0: --ubatch")
      ->check(CLI::Range(0, model::kMaxMaxBatch))
      ->capture_default_str();
  int admit_window_ms = int(sched_opts.admit_window.count());
  app.add_option("--admit-window", admit_window_ms,
                 "milliseconds an idle server waits for the rest of a burst of requests (each arriving within 2 ms of "
                 "the last) so that their prompts share the first pass; 0: start at the first request")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_option("--http-threads", so.http_threads, "connections served at once (each streaming request holds one)")
      ->check(CLI::Range(4, 4096))
      ->capture_default_str();
  app.add_option("--shutdown-timeout", shutdown_timeout,
                 "seconds running requests get to finish after SIGTERM before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--chat-template", template_name, "override the template family: chatml|llama3|mistral|llama2|gemma");
  app.add_option("--alias", so.model_id, "model id for /v1/models and responses (default: the file name)");
  add_sampling_flags(app, sf);
  add_stream_flags(app, stf);
  if (auto rc = parse_flags(app, argc, argv)) return *rc;
  if (auto st = resolve_stream_flags(stf); !st.is_ok()) return report_error("serve", st.status());
  if (sched_opts.step_tokens > mf.max_batch) {
    return report_error("serve", invalid_argument("--batch-tokens " + std::to_string(sched_opts.step_tokens) +
                                                  " is more than --ubatch " + std::to_string(mf.max_batch) +
                                                  " (the tokens one forward pass takes)"));
  }
  // A step decodes one token of every generating request: fewer tokens a step than requests would
  // leave the later requests waiting on the earlier ones.
  const int step_tokens = sched_opts.step_tokens > 0 ? sched_opts.step_tokens : mf.max_batch;
  if (step_tokens < parallel) {
    return report_error("serve", invalid_argument(std::string(sched_opts.step_tokens > 0 ? "--batch-tokens " : "--ubatch ") +
                                                  std::to_string(step_tokens) + " is less than --parallel " +
                                                  std::to_string(parallel) +
                                                  ": a batched pass takes a decode token of every running request"));
  }
  if (!serve::http_available()) {
    return report_error("serve", unsupported("this sluice was built without cpp-httplib (install libcpp-httplib-dev "
                                             "and rebuild)"));
  }
  auto sampling = resolve_sampling(sf);
  if (!sampling.is_ok()) return report_error("serve", sampling.status());
  so.sampling = *sampling;
  so.seed_given = sf.seed_given;
  if (so.model_id.empty()) so.model_id = std::filesystem::path(mf.model_path).stem().string();

  auto meta = open_model_meta(mf.model_path);
  if (!meta.is_ok()) return report_error("serve", meta.status());
  std::optional<model::ChatTemplate> chat;
  if (auto t = chat_template_for(*meta->file, template_name); t.is_ok()) {
    chat = *t;
  } else if (!template_name.empty()) {
    return report_error("serve", t.status());
  } else {
    std::fprintf(stderr, "note: %s; /v1/chat/completions is off (use --chat-template)\n", t.status().message().c_str());
  }

  // Block the shutdown signals before any thread starts (they all inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that hangs up mid-response must not kill the process: writes fail with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);

  mf.max_sequences = parallel;
  if (kv_positions == 0) {
    // The context of each request times the slots: -c when given, else the model's default
    // context (its own length, capped at 4096 by model/; 4096 when the header cannot tell).
    int ctx = mf.n_ctx;
    if (ctx <= 0) {
      ctx = 4096;
      if (auto arch_name = meta->file->get_string("general.architecture"); arch_name.is_ok()) {
        if (const model::ArchSpec* arch = model::find_arch(*arch_name)) {
          if (auto cfg = model::read_config(*meta->file, *arch); cfg.is_ok() && cfg->n_ctx_train > 0) {
            ctx = std::min(ctx, cfg->n_ctx_train);
          }
        }
      }
    }
    kv_positions = ctx * parallel;
  }
  mf.kv_positions = kv_positions;
  auto loaded = load_model(mf, stf);
  if (!loaded.is_ok()) return report_error("serve", loaded.status());
  model::Model& m = *loaded->model;
  if (m.max_sequences() < parallel) {
    std::fprintf(stderr, "note: this model runs %d sequence(s) at once; --parallel %d is lowered to %d\n",
                 m.max_sequences(), parallel, m.max_sequences());
  }
  sched_opts.parallel = parallel;
  // Sampling runs between passes, when the CPU backend's threads are idle: as many threads.
  sched_opts.sample_threads = std::min(parallel, backend::cpu_threads(mf.n_threads));
  sched_opts.prompt_cache = !no_prompt_cache;
  sched_opts.admit_window = std::chrono::milliseconds(admit_window_ms);
  serve::Scheduler scheduler(m, *meta->tokenizer, sched_opts);
  serve::HttpServer server(scheduler, *meta->tokenizer, chat ? &*chat : nullptr, so);
  if (Status st = server.bind(); !st.is_ok()) {
    scheduler.shutdown(std::chrono::milliseconds(0));
    return report_error("serve", st);
  }
  std::fprintf(stderr,
               "sluice serve: %s on %s, context %d, %d parallel, KV pool %d blocks of %d positions\n"
               "listening on http://%s:%d\n",
               so.model_id.c_str(), m.backend_name(), m.n_ctx(), scheduler.parallel(), m.kv_blocks_total(),
               m.kv_block_size(), so.host.c_str(), server.port());
  std::fflush(stderr);

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!done.load()) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig != SIGTERM && sig != SIGINT) continue;
      std::fprintf(stderr, "sluice serve: %s: no new connections; running requests get %.0f s\n",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", shutdown_timeout);
      server.stop();
      scheduler.shutdown(std::chrono::milliseconds(int64_t(shutdown_timeout * 1000)));
      // A signal that came before the accept loop started found nothing to stop: repeat until
      // run() has returned. Connections kept alive between requests would otherwise hold it up
      // to their idle timeout.
      while (!done.load()) {
        server.stop();
        server.close_connections();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return;
    }
  });
  Status st = server.run();  // returns after stop(), once the handlers in flight have returned
  done.store(true);
  watcher.join();
  scheduler.shutdown(std::chrono::milliseconds(0));
  if (!st.is_ok()) return report_error("serve", st);
  std::fprintf(stderr, "sluice serve: stopped\n");
  // A streamed model's counters over every pass served (tiers, copies, CPU layers, batch placements).
  if (Status fs = finish_stream(stderr, *loaded, decode::Timings{}); !fs.is_ok()) return report_error("serve", fs);
  return kExitOk;
}

}  // namespace sluice::app
