#include "model/chat_template.h"

#include <vector>

namespace sluice::model {
namespace {

constexpr std::string_view kWhitespace = " \t\n\r\f\v";

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kWhitespace);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kWhitespace);
  return std::string(s.substr(b, e - b + 1));
}

// A default system prompt written as a literal in a ChatML template, e.g. SmolLM2's
//   {{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\n' }}
// The "\n" may be a real newline or the two characters of the escape. Anything built from
// expressions (quotes, braces, '+') is not a literal and yields "".
std::string chatml_default_system(std::string_view t) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t pos = t.find(kOpen); pos != std::string_view::npos; pos = t.find(kOpen, pos + 1)) {
    size_t start = pos + kOpen.size();
    if (t.substr(start, 1) == "\n") {
      start += 1;
    } else if (t.substr(start, 2) == "\\n") {
      start += 2;
    } else {
      continue;
    }
    const size_t end = t.find(kClose, start);
    if (end == std::string_view::npos) continue;
    const std::string_view body = t.substr(start, end - start);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return std::string(body);
  }
  return {};
}

bool valid_role(const std::string& r) { return r == "system" || r == "user" || r == "assistant"; }

}  // namespace

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kLlama3: return "llama3";
    case ChatFamily::kMistral: return "mistral";
    case ChatFamily::kLlama2: return "llama2";
    case ChatFamily::kGemma: return "gemma";
  }
  return "unknown";
}

Result<ChatTemplate> ChatTemplate::by_name(std::string_view name) {
  for (ChatFamily f : {ChatFamily::kChatML, ChatFamily::kLlama3, ChatFamily::kMistral, ChatFamily::kLlama2,
                       ChatFamily::kGemma}) {
    if (name == chat_family_name(f)) return ChatTemplate(f);
  }
  return invalid_argument("unknown chat template '" + std::string(name) +
                          "' (known: chatml, llama3, mistral, llama2, gemma)");
}

Result<ChatTemplate> ChatTemplate::for_architecture(std::string_view arch,
                                                   const std::function<bool(std::string_view)>& has_token) {
  if (arch.rfind("gemma", 0) == 0 && has_token("<start_of_turn>") && has_token("<end_of_turn>")) {
    return ChatTemplate(ChatFamily::kGemma);
  }
  return unsupported("no chat format known for architecture " + std::string(arch) + " without a template");
}

Result<ChatTemplate> ChatTemplate::detect(std::string_view t) {
  // Most specific markers first: llama2 templates also contain [INST].
  if (t.find("<|im_start|>") != std::string_view::npos) {
    return ChatTemplate(ChatFamily::kChatML, chatml_default_system(t));
  }
  if (t.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate(ChatFamily::kLlama3);
  if (t.find("<start_of_turn>") != std::string_view::npos) return ChatTemplate(ChatFamily::kGemma);
  if (t.find("[INST]") != std::string_view::npos) {
    return ChatTemplate(t.find("<<SYS>>") != std::string_view::npos ? ChatFamily::kLlama2 : ChatFamily::kMistral);
  }
  if (t.empty()) return unsupported("the model has no chat template (tokenizer.chat_template)");
  return unsupported("unrecognised chat template (no chatml, llama3, mistral, llama2 or gemma markers)");
}

std::string ChatTemplate::assistant_suffix() const {
  switch (family_) {
    case ChatFamily::kChatML: return "<|im_end|>\n";
    case ChatFamily::kLlama3: return "<|eot_id|>";
    case ChatFamily::kMistral: return "</s>";
    case ChatFamily::kLlama2: return " </s>";
    case ChatFamily::kGemma: return "<end_of_turn>\n";
  }
  return {};
}

Result<std::string> ChatTemplate::apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!valid_role(messages[i].role)) {
      return invalid_argument("chat message " + std::to_string(i) + " has role '" + messages[i].role +
                              "' (expected system, user or assistant)");
    }
    if (i > 0 && messages[i].role == "system") {
      return invalid_argument("chat message " + std::to_string(i) + ": a system message may only come first");
    }
  }
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const std::span<const ChatMessage> turns = has_system ? messages.subspan(1) : messages;
  const std::string system = has_system ? messages[0].content : default_system_;
  std::string out;

  switch (family_) {
    case ChatFamily::kChatML:
      // The default system turn appears only when the template has one and none is given
      // (and, as in SmolLM2's template, only in front of a non-empty conversation).
      if (!has_system && !system.empty() && !messages.empty()) {
        out += "<|im_start|>system\n" + system + "<|im_end|>\n";
      }
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;

    case ChatFamily::kLlama3:
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;

    case ChatFamily::kMistral: {
      bool first_user = true;
      for (const auto& m : turns) {
        if (m.role == "user") {
          std::string content = m.content;
          if (first_user && has_system) content = system + "\n\n" + content;
          first_user = false;
          out += "[INST] " + content + " [/INST]";
        } else {
          out += m.content + "</s>";
        }
      }
      break;  // the model answers right after [/INST]: no generation prompt
    }

    case ChatFamily::kLlama2: {
      bool first = true;
      for (const auto& m : turns) {
        if (m.role == "user") {
          std::string content = m.content;
          if (first && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
          // Every user turn opens a new sequence; the first BOS comes from the tokenizer.
          out += (first ? "" : "<s>") + std::string("[INST] ") + trim(content) + " [/INST]";
        } else {
          out += ' ';  // appended piece by piece: " " + string&& trips GCC 12's -Wrestrict
          out += trim(m.content);
          out += " </s>";
        }
        first = false;
      }
      break;
    }

    case ChatFamily::kGemma: {
      bool first_user = true;
      for (const auto& m : turns) {
        std::string content = m.content;
        if (m.role == "user" && first_user && has_system) content = system + "\n\n" + content;
        if (m.role == "user") first_user = false;
        out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n" + trim(content) +
               "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
  }
  return out;
}

Result<std::string> ChatTemplate::continuation(std::span<const ChatMessage> history, std::span<const ChatMessage> more,
                                               bool add_generation_prompt) const {
  std::vector<ChatMessage> all(history.begin(), history.end());
  all.insert(all.end(), more.begin(), more.end());
  SLUICE_ASSIGN_OR_RETURN(std::string before, apply(history, false));
  SLUICE_ASSIGN_OR_RETURN(std::string after, apply(all, add_generation_prompt));
  // Holds for every family above (messages render independently, in order); a violation is a
  // bug in this file, not bad input.
  SLUICE_CHECK(after.compare(0, before.size(), before) == 0,
               std::string("chat template ") + name() + ": appending messages changed earlier text");
  return after.substr(before.size());
}

}  // namespace sluice::model
