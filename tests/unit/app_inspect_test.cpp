// sluice inspect's report on the real SmolLM2-135M file: facts checked against python's gguf.
#include "app/inspect.h"
#include "test_util.h"

namespace sluice::app {
namespace {

TEST(InspectSmolLM2, ReportMatchesTheFile) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const InspectReport rep = make_report(*f);
  EXPECT_EQ(rep.architecture, "llama");
  EXPECT_EQ(rep.tokenizer_model, "gpt2");
  EXPECT_EQ(rep.tokenizer_pre, "smollm");
  EXPECT_EQ(rep.vocab_size, 49152u);
  EXPECT_EQ(rep.n_merges, 48900u);
  ASSERT_EQ(rep.layers.size(), 30u);
  EXPECT_EQ(rep.tensors.size(), 272u);
  // Layer 0: 4 x Q4_1 [576,576]/[576,192] attention, 3 x Q4_1 FFN, 2 F32 norms.
  const LayerBytes& l0 = rep.layers[0];
  EXPECT_EQ(l0.by_role.at("attn_q"), 207360u);
  EXPECT_EQ(l0.by_role.at("attn_k"), 69120u);
  EXPECT_EQ(l0.by_role.at("ffn_down"), 552960u);
  EXPECT_EQ(l0.by_role.at("norms"), 2u * 576 * 4);
  EXPECT_EQ(l0.total, 2216448u);
  EXPECT_EQ(rep.non_layer.at("token_embd"), 30081024u);
  EXPECT_EQ(rep.non_layer.count("output"), 0u);  // tied embeddings
  EXPECT_EQ(rep.by_type.at("q8_0"), 30081024u);
  bool found = false;
  for (const auto& [k, v] : rep.hparams) found |= (k == "feed_forward_length" && v == "1536");
  EXPECT_TRUE(found);
  const auto j = render_json(rep);
  EXPECT_EQ(j["layers"].size(), 30u);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["shape"][1], 49152);
  const std::string text = render_text(rep);
  EXPECT_NE(text.find("block_count = 30"), std::string::npos);
  EXPECT_NE(text.find("tokenizer: model gpt2, pre smollm, vocab 49152"), std::string::npos);
}

}  // namespace
}  // namespace sluice::app
