// Progress of long byte-moving operations (loading, pinning, writing a synth file), for people
// watching a terminal and for logs. On a terminal: one line redrawn in place with '\r', at most
// every kRedrawSeconds (the work moves GB/s in MB chunks; redrawing per chunk would flood the
// terminal). Not a terminal (CI, redirected logs): nothing while it runs, then exactly one summary
// line, so a log holds one line per operation instead of hundreds of '\r' frames.
//
// The code doing the work only reports (done, total) through a ProgressFn; the caller decides
// whether and how to draw (progress_bar below), so library folders do no terminal I/O.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace sluice::core {

// (bytes done so far, total bytes) of one operation, reported by the code doing the work. Calls
// come from one thread at a time; done never decreases.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// Where a Progress draws: a text sink, whether it is a terminal, and a monotonic clock in seconds
// (tests pass a fake sink and clock).
struct ProgressOutput {
  std::function<void(std::string_view)> write;
  bool terminal = false;
  std::function<double()> now;

  static ProgressOutput to_stderr() {
    ProgressOutput o;
    o.write = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stderr);
      std::fflush(stderr);
    };
    o.terminal = ::isatty(::fileno(stderr)) == 1;
    o.now = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
    return o;
  }
};

class Progress {
 public:
  static constexpr double kRedrawSeconds = 0.1;
  static constexpr int kBarWidth = 24;

  Progress(std::string label, uint64_t total, ProgressOutput out = ProgressOutput::to_stderr())
      : label_(std::move(label)), total_(total), out_(std::move(out)) {
    start_ = last_draw_ = out_.now();
  }
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t bytes) { set(done_ + bytes); }
  // Absolute position. Redraws (terminal only) when kRedrawSeconds passed since the last frame.
  void set(uint64_t done) {
    if (finished_) return;
    done_ = std::max(done_, done);
    if (!out_.terminal) return;
    const double t = out_.now();
    if (t - last_draw_ < kRedrawSeconds) return;
    last_draw_ = t;
    out_.write(redraw(t - start_));
  }
  // The last word: the terminal's line at its final state and a newline, or the one summary line.
  // Idempotent; the destructor calls it.
  void finish() {
    if (finished_) return;
    finished_ = true;
    const double s = out_.now() - start_;
    std::string line = out_.terminal ? redraw(s) : summary(s);
    line += '\n';
    out_.write(line);
  }

  uint64_t done() const { return done_; }
  uint64_t total() const { return total_; }

  // "\r" and the frame: the terminal's line redrawn in place. Appended, not "\r" + string&&
  // (GCC 12's -Wrestrict false positive on that insert).
  std::string redraw(double seconds) const {
    std::string line(1, '\r');
    line += frame(seconds);
    return line;
  }
  // "label [#####.....]  45%  1.23 / 2.73 GiB  1.52 GB/s  ETA 0:12" (padded so a shorter frame
  // overwrites a longer one).
  std::string frame(double seconds) const {
    const double frac = total_ ? std::min(1.0, double(done_) / double(total_)) : 1.0;
    const int fill = int(frac * kBarWidth);
    std::string bar(size_t(fill), '#');
    bar.append(size_t(kBarWidth - fill), '.');
    char line[256];
    std::snprintf(line, sizeof line, "%s [%s] %3d%%  %s / %s  %s  ETA %s", label_.c_str(), bar.c_str(),
                  int(frac * 100), bytes(done_).c_str(), bytes(total_).c_str(), rate(seconds).c_str(),
                  eta(seconds).c_str());
    std::string s = line;
    if (s.size() < 79) s.append(79 - s.size(), ' ');
    return s;
  }
  // "label: 2.73 GiB in 1.80 s, 1.52 GB/s" ("1.20 of 2.73 GiB" when it stopped short).
  std::string summary(double seconds) const {
    const std::string amount =
        done_ < total_ ? bytes(done_) + " of " + bytes(total_) : bytes(done_);
    char line[256];
    std::snprintf(line, sizeof line, "%s: %s in %.2f s, %s", label_.c_str(), amount.c_str(), seconds,
                  rate(seconds).c_str());
    return line;
  }

  static std::string bytes(uint64_t b) {
    char s[32];
    if (b >= (1ull << 30)) {
      std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(1ull << 30));
    } else {
      std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1ull << 20));
    }
    return s;
  }

 private:
  // Decimal GB/s, the unit bandwidths are quoted in everywhere else in sluice.
  std::string rate(double seconds) const {
    char s[32];
    std::snprintf(s, sizeof s, "%.2f GB/s", seconds > 0 ? double(done_) / 1e9 / seconds : 0.0);
    return s;
  }
  std::string eta(double seconds) const {
    if (done_ >= total_) return "0:00";
    if (done_ == 0 || seconds <= 0) return "?:??";
    const uint64_t left = uint64_t(double(total_ - done_) * seconds / double(done_) + 0.5);
    char s[32];
    if (left >= 3600) {
      std::snprintf(s, sizeof s, "%llu:%02llu:%02llu", (unsigned long long)(left / 3600),
                    (unsigned long long)(left / 60 % 60), (unsigned long long)(left % 60));
    } else {
      std::snprintf(s, sizeof s, "%llu:%02llu", (unsigned long long)(left / 60), (unsigned long long)(left % 60));
    }
    return s;
  }

  std::string label_;
  uint64_t total_;
  ProgressOutput out_;
  uint64_t done_ = 0;
  double start_ = 0, last_draw_ = 0;
  bool finished_ = false;
};

// A ProgressFn that draws a Progress labelled `label`: created at the first report, with the
// total that report gives (so an operation that never reports prints nothing), and finished when
// done reaches the total or when the last copy of the function is destroyed (a failed operation
// still gets its final line, saying how far it got).
inline ProgressFn progress_bar(std::string label, ProgressOutput out = ProgressOutput::to_stderr()) {
  struct State {
    std::string label;
    ProgressOutput out;
    std::unique_ptr<Progress> bar;
  };
  auto st = std::make_shared<State>(State{std::move(label), std::move(out), nullptr});
  return [st](uint64_t done, uint64_t total) {
    if (!st->bar) st->bar = std::make_unique<Progress>(st->label, total, st->out);
    st->bar->set(done);
    if (done >= total) st->bar->finish();
  };
}

}  // namespace sluice::core
