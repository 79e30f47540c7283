// Chat formatting for the common template families, chosen from markers in the GGUF's
// tokenizer.chat_template text. This is a table of known formats, not a Jinja engine: each
// family below is written out by hand from its published template.
//
//   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... gen: <|im_start|>assistant\n
//            (SmolLM2, Qwen; a default system prompt written literally in the template, as
//            SmolLM2's and Qwen 2.5's are, is used when the conversation has none)
//   llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
//            gen: <|start_header_id|>assistant<|end_header_id|>\n\n
//   mistral  [INST] {user} [/INST]{assistant}</s>   (a system message is prepended to the
//            first user message, separated by a blank line)
//   llama2   [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
//            (no generation prompt: the model answers after [/INST])
//   gemma    <start_of_turn>{user|model}\n{content|trim}<end_of_turn>\n  gen: <start_of_turn>model\n
//            (system folded into the first user turn, as Gemma 3's template does)
//
// The beginning-of-sequence token is never part of the text: tokenize the result with the
// model's add_bos setting (tokenizer.ggml.add_bos_token), as the templates' leading
// {{ bos_token }} intends. Later BOS tokens (llama2's per-turn <s>) are written as text and
// need special-token parsing.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace sluice::model {

enum class ChatFamily { kChatML, kLlama3, kMistral, kLlama2, kGemma };
const char* chat_family_name(ChatFamily f);  // "chatml", "llama3", ...

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatFamily family, std::string default_system = "")
      : family_(family), default_system_(std::move(default_system)) {}

  // From a tokenizer.chat_template text. kUnsupported naming the known families when no
  // marker matches (the caller may then pick one with by_name()).
  static Result<ChatTemplate> detect(std::string_view jinja_text);
  // For a file without tokenizer.chat_template: the format its architecture was trained with
  // (gemma, gemma2, gemma3 -> gemma), when the vocabulary has that format's turn markers
  // (has_token("<start_of_turn>") and has_token("<end_of_turn>")). kUnsupported otherwise.
  static Result<ChatTemplate> for_architecture(std::string_view arch,
                                               const std::function<bool(std::string_view)>& has_token);
  // "chatml", "llama3", "mistral", "llama2", "gemma"; kInvalidArgument otherwise.
  static Result<ChatTemplate> by_name(std::string_view name);

  ChatFamily family() const { return family_; }
  const char* name() const { return chat_family_name(family_); }
  const std::string& default_system() const { return default_system_; }

  // The conversation as the model was trained to see it. Errors (kInvalidArgument) on an
  // unknown role or a system message anywhere but first.
  Result<std::string> apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  // What follows an assistant message's content: the text that stands for the
  // end-of-generation token a reply ends with. Appending a message to a conversation only
  // appends text, so a chat continues with assistant_suffix() + the new messages' text.
  std::string assistant_suffix() const;

  // The text `more` adds after `history`: apply(history + more, add_generation_prompt)
  // without its apply(history, false) prefix. What a chat evaluates for a new turn, after the
  // assistant_suffix() of the previous reply.
  Result<std::string> continuation(std::span<const ChatMessage> history, std::span<const ChatMessage> more,
                                   bool add_generation_prompt) const;

 private:
  ChatFamily family_;
  std::string default_system_;
};

}  // namespace sluice::model
