// Chat templates: family detection from template markers, the exact text of each family,
// SmolLM2's template compared with its own Jinja rendering (fixture made by
// tests/fixtures/chat_template/render_smollm2.py), and the append-only property chat relies on.
#include "model/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "test_util.h"

namespace sluice::model {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "Capital of France?"},
};

std::string render(const ChatTemplate& t, const std::vector<ChatMessage>& m, bool gen) {
  auto r = t.apply(m, gen);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? *r : "";
}

TEST(ChatTemplate, DetectsFamiliesFromMarkers) {
  auto family = [](std::string_view text) {
    auto r = ChatTemplate::detect(text);
    EXPECT_TRUE(r.is_ok()) << text;
    return r.is_ok() ? std::string(r->name()) : "";
  };
  EXPECT_EQ(family("{{'<|im_start|>' + message['role'] + '\\n'}}"), "chatml");
  EXPECT_EQ(family("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"), "llama3");
  EXPECT_EQ(family("{{ '<start_of_turn>' + role + '\\n' }}"), "gemma");
  EXPECT_EQ(family("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }} <<SYS>>"), "llama2");
  EXPECT_EQ(family("{{ '[INST] ' + message['content'] + ' [/INST]' }}"), "mistral");

  auto unknown = ChatTemplate::detect("{{ message['content'] }}");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("chatml"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::detect("").is_ok());

  EXPECT_TRUE(ChatTemplate::by_name("gemma").is_ok());
  auto bad = ChatTemplate::by_name("vicuna");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
}

TEST(ChatTemplate, ChatMLDefaultSystemPromptIsReadFromTheTemplateLiteral) {
  // Real newline (as stored in GGUF) and the two-character escape both work.
  auto a = ChatTemplate::detect("{{ '<|im_start|>system\nYou are X.<|im_end|>\n' }}{{'<|im_start|>'}}");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->default_system(), "You are X.");
  auto b = ChatTemplate::detect("{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->default_system(), "You are Qwen.");
  // An expression is not a default prompt.
  auto c = ChatTemplate::detect("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->default_system(), "");
}

TEST(ChatTemplate, ChatMLExact) {
  ChatTemplate t(ChatFamily::kChatML);
  EXPECT_EQ(render(t, kConversation, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nCapital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  ChatTemplate with_default(ChatFamily::kChatML, "Default.");
  EXPECT_EQ(render(with_default, {{"user", "x"}}, false),
            "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
  EXPECT_EQ(render(with_default, {}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3Exact) {
  ChatTemplate t(ChatFamily::kLlama3);
  EXPECT_EQ(render(t, kConversation, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nCapital of France?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(t, {{"user", "  padded \n"}}, false),
            "<|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>");  // | trim
}

TEST(ChatTemplate, MistralExact) {
  ChatTemplate t(ChatFamily::kMistral);
  EXPECT_EQ(render(t, kConversation, true),
            "[INST] Be brief.\n\nHi! [/INST]Hello.</s>[INST] Capital of France? [/INST]");
  EXPECT_EQ(render(t, {{"user", "a"}}, true), "[INST] a [/INST]");
}

TEST(ChatTemplate, Llama2Exact) {
  ChatTemplate t(ChatFamily::kLlama2);
  EXPECT_EQ(render(t, kConversation, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
            "<s>[INST] Capital of France? [/INST]");
  EXPECT_EQ(render(t, {{"user", "a"}}, true), "[INST] a [/INST]");
}

TEST(ChatTemplate, GemmaExact) {
  ChatTemplate t(ChatFamily::kGemma);
  EXPECT_EQ(render(t, kConversation, true),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nCapital of France?<end_of_turn>\n"
            "<start_of_turn>model\n");
}

// A file without tokenizer.chat_template (the published Gemma 3 270M GGUF): the architecture's
// format, only where the vocabulary has its turn markers.
TEST(ChatTemplate, ForArchitectureWithoutTemplate) {
  auto gemma_vocab = [](std::string_view t) { return t == "<start_of_turn>" || t == "<end_of_turn>"; };
  auto no_vocab = [](std::string_view) { return false; };
  auto t = ChatTemplate::for_architecture("gemma3", gemma_vocab);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->family(), ChatFamily::kGemma);
  EXPECT_FALSE(ChatTemplate::for_architecture("gemma3", no_vocab).is_ok());
  EXPECT_FALSE(ChatTemplate::for_architecture("llama", gemma_vocab).is_ok());
}

TEST(ChatTemplate, RejectsUnknownRolesAndLateSystemMessages) {
  ChatTemplate t(ChatFamily::kChatML);
  auto r = t.apply(std::vector<ChatMessage>{{"tool", "x"}}, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("tool"), std::string::npos);
  auto late = t.apply(std::vector<ChatMessage>{{"user", "x"}, {"system", "y"}}, true);
  ASSERT_FALSE(late.is_ok());
  EXPECT_EQ(late.status().code(), ErrorCode::kInvalidArgument);
}

TEST(ChatTemplate, ContinuationIsSuffixAfterTheReplyEveryFamily) {
  for (ChatFamily f : {ChatFamily::kChatML, ChatFamily::kLlama3, ChatFamily::kMistral, ChatFamily::kLlama2,
                       ChatFamily::kGemma}) {
    ChatTemplate t(f, f == ChatFamily::kChatML ? "Default." : "");
    const std::vector<ChatMessage> history(kConversation.begin(), kConversation.begin() + 3);
    const std::vector<ChatMessage> more(kConversation.begin() + 3, kConversation.end());
    auto cont = t.continuation(history, more, true);
    ASSERT_TRUE(cont.is_ok()) << t.name();
    // What a chat has in its KV cache after turn 1: the first turn's prompt + the reply as
    // generated; it then evaluates assistant_suffix() + continuation. (A llama2 model answers
    // " Hello." after "[/INST]": its template writes the space that the reply carries.)
    const std::vector<ChatMessage> first(kConversation.begin(), kConversation.begin() + 2);
    const std::string cached = render(t, first, true) + (f == ChatFamily::kLlama2 ? " Hello." : "Hello.");
    EXPECT_EQ(cached + t.assistant_suffix() + *cont, render(t, kConversation, true)) << t.name();
  }
}

TEST(ChatTemplate, SmolLM2MatchesItsJinjaRendering) {
  std::ifstream in(test::fixture_path("chat_template/smollm2.json"));
  ASSERT_TRUE(in) << "missing fixture chat_template/smollm2.json";
  const auto fixture = nlohmann::json::parse(in);
  auto t = ChatTemplate::detect(fixture["template"].get<std::string>());
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->family(), ChatFamily::kChatML);
  EXPECT_EQ(t->default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  ASSERT_GE(fixture["cases"].size(), 8u);
  for (const auto& c : fixture["cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(render(*t, messages, c["add_generation_prompt"]), c["expected"].get<std::string>())
        << c["messages"].dump();
  }
}

TEST(ChatTemplate, SmolLM2TemplateInTheRealModelFile) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  auto text = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  std::ifstream in(test::fixture_path("chat_template/smollm2.json"));
  ASSERT_TRUE(in);
  EXPECT_EQ(*text, nlohmann::json::parse(in)["template"].get<std::string>()) << "fixture is stale: regenerate it";
  auto t = ChatTemplate::detect(*text);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->family(), ChatFamily::kChatML);
}

}  // namespace
}  // namespace sluice::model
