/* The serve library's chat templates: each format's rendering of one
 * conversation (the same texts tests/cli/test_serve.c sees through the
 * server), the assistant spans SFT trains on, names, detection, and the
 * errors naming the message. */
#include "test.h"

#include "nabla/serve.h"

#define MSG(r, c) {.role = r, .content = c, .content_len = sizeof c - 1}

static void test_render(nb_ctx *ctx) {
  static const nb_serve_chat_msg msgs[] = {MSG("system", "S"), MSG("user", " hi "), MSG("assistant", "yo"), MSG("user", "q"),
                                           MSG("assistant", " ok ")};
  static const struct {
    nb_serve_chat_format f;
    int first; /* gemma: no system message */
    const char *want, *spans[2];
  } cases[] = {
      {NB_SERVE_CHAT_CHATML, 0,
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
       "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n ok <|im_end|>\n",
       {"yo<|im_end|>", " ok <|im_end|>"}},
      {NB_SERVE_CHAT_LLAMA3, 0,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
       "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>",
       {"yo<|eot_id|>", "ok<|eot_id|>"}},
      {NB_SERVE_CHAT_GEMMA, 1,
       "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n<start_of_turn>user\nq"
       "<end_of_turn>\n<start_of_turn>model\nok<end_of_turn>\n",
       {"yo<end_of_turn>", "ok<end_of_turn>"}},
      {NB_SERVE_CHAT_LLAMA2, 0, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n hi [/INST] yo </s><s>[INST] q [/INST] ok </s>",
       {"yo </s>", "ok </s>"}},
      {NB_SERVE_CHAT_MISTRAL, 0, "<s>[INST] S\n\n hi  [/INST]yo</s>[INST] q [/INST] ok </s>", {"yo</s>", " ok </s>"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    nb_serve_chat_text t;
    const char *name = nb_serve_chat_format_name(cases[i].f);
    CHECK_OK(ctx, nb_serve_chat_render(ctx, cases[i].f, msgs + cases[i].first, 5 - cases[i].first, false, &t));
    CHECK_MSG(t.text && !strcmp(t.text, cases[i].want) && t.len == strlen(cases[i].want), "%s: '%s'", name, t.text);
    CHECK_MSG(t.n_assistant == 2, "%s: %d assistant spans", name, t.n_assistant);
    for (int k = 0; k < t.n_assistant && k < 2; k++) {
      size_t n = t.assistant[k].end - t.assistant[k].start;
      CHECK_MSG(n == strlen(cases[i].spans[k]) && !memcmp(t.text + t.assistant[k].start, cases[i].spans[k], n),
                "%s: span %d is '%.*s'", name, k, (int)n, t.text + t.assistant[k].start);
    }
    CHECK(t.add_bos == (cases[i].f == NB_SERVE_CHAT_CHATML));
    nb_serve_chat_text_free(&t);
    CHECK(nb_serve_chat_format_parse(name) == cases[i].f);
  }
  /* the generation prompt */
  nb_serve_chat_text t;
  CHECK_OK(ctx, nb_serve_chat_render(ctx, NB_SERVE_CHAT_CHATML, msgs + 1, 1, true, &t));
  CHECK(t.text && !strcmp(t.text, "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n") && t.n_assistant == 0);
  nb_serve_chat_text_free(&t);
}

static void test_names_and_errors(nb_ctx *ctx) {
  CHECK(nb_serve_chat_format_parse("chatml2") == NB_SERVE_CHAT_NONE);
  CHECK(!strcmp(nb_serve_chat_format_name(NB_SERVE_CHAT_NONE), "none"));
  CHECK(nb_serve_chat_detect("{% if x %}<<SYS>>[INST]") == NB_SERVE_CHAT_LLAMA2);
  CHECK(nb_serve_chat_detect("{{ messages }}") == NB_SERVE_CHAT_NONE);
  CHECK(!strcmp(nb_serve_chat_end(NB_SERVE_CHAT_LLAMA3), "<|eot_id|>") && !nb_serve_chat_end(NB_SERVE_CHAT_MISTRAL));
  nb_serve_chat_text t;
  static const nb_serve_chat_msg robot[] = {MSG("user", "a"), MSG("robot", "b")};
  CHECK(nb_serve_chat_render(ctx, NB_SERVE_CHAT_CHATML, robot, 2, false, &t) != NB_OK && !t.text);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "messages[1].role 'robot' is not system, user or assistant");
  static const nb_serve_chat_msg sys[] = {MSG("system", "a"), MSG("user", "b")};
  CHECK(nb_serve_chat_render(ctx, NB_SERVE_CHAT_GEMMA, sys, 2, false, &t) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "messages[0]: the gemma template has no system role");
  static const nb_serve_chat_msg late[] = {MSG("user", "a"), MSG("system", "b")};
  CHECK(nb_serve_chat_render(ctx, NB_SERVE_CHAT_MISTRAL, late, 2, false, &t) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "messages[1]: the mistral template takes a system message only first");
  CHECK(nb_serve_chat_render(ctx, NB_SERVE_CHAT_CHATML, late, 0, false, &t) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "messages: empty");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  test_render(ctx);
  test_names_and_errors(ctx);
  nb_ctx_destroy(ctx);
  return nb_test_summary("serve/test_chat");
}
