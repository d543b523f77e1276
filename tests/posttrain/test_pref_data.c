/* Preference data: JSONL pairs tokenized (byte level) into [P, 2, T] rows
 * with exact inputs, targets, completion mask and valid mask; truncation;
 * blank lines; every malformed line refused with file:line and the field;
 * nb_pt_pref_rows puts the chosen rows first. */
#include <string.h>

#include "primcheck.h"
#include "testfs.h"
#include "nabla/posttrain.h"

static char dir[512];

static nb_tree *load(nb_ctx *ctx, const char *text, int64_t T, int64_t vocab, nb_pt_pref_data_info *info, char *path) {
  snprintf(path, 600, "%s/p.jsonl", dir);
  nb_test_write_text(path, text);
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  return nb_pt_pref_data_load(ctx, path, &tok, T, vocab, info);
}

static void check_row(const nb_tree *t, int64_t pair, int row, const char *in, const char *tg, const char *mask,
                      const char *valid) {
  int64_t T = (int64_t)strlen(in), o = (pair * 2 + row) * T;
  const nb_array *a[4] = {nb_tree_get_array(t, "inputs"), nb_tree_get_array(t, "targets"), nb_tree_get_array(t, "mask"),
                          nb_tree_get_array(t, "valid")};
  for (int64_t i = 0; i < T; i++) {
    /* '.' is padding (id 0); mask/valid as '1'/'0' */
    int want_in = in[i] == '.' ? 0 : in[i], want_tg = tg[i] == '.' ? 0 : tg[i];
    CHECK_MSG(nb_array_get(a[0], o + i) == want_in, "pair %lld row %d inputs[%lld] = %g, want %d", (long long)pair, row,
              (long long)i, nb_array_get(a[0], o + i), want_in);
    CHECK_MSG(nb_array_get(a[1], o + i) == want_tg, "pair %lld row %d targets[%lld] = %g, want %d", (long long)pair, row,
              (long long)i, nb_array_get(a[1], o + i), want_tg);
    CHECK_MSG(nb_array_get(a[2], o + i) == (mask[i] == '1'), "pair %lld row %d mask[%lld]", (long long)pair, row, (long long)i);
    CHECK_MSG(nb_array_get(a[3], o + i) == (valid[i] == '1'), "pair %lld row %d valid[%lld]", (long long)pair, row, (long long)i);
  }
}

static void test_rows(nb_ctx *ctx) {
  char path[600];
  nb_pt_pref_data_info info;
  nb_tree *t = load(ctx,
                    "{\"prompt\": \"ab\", \"chosen\": \"cd\", \"rejected\": \"xyz\"}\n"
                    "\n"
                    "{\"prompt\": \"q\", \"chosen\": \"0123456\", \"rejected\": \"r\", \"extra\": 1}\n",
                    6, 256, &info, path);
  CHECK_MSG(t, "%s", nb_ctx_error(ctx));
  if (!t) return;
  CHECK(info.pairs == 2 && info.n_truncated == 1);
  CHECK(info.tokens == (2 + 2) + (2 + 3) + (1 + 7) + (1 + 1));
  const nb_array *in = nb_tree_get_array(t, "inputs");
  CHECK(nb_array_rank(in) == 3 && nb_array_dims(in)[0] == 2 && nb_array_dims(in)[1] == 2 && nb_array_dims(in)[2] == 6);
  CHECK(nb_array_dtype(nb_tree_get_array(t, "mask")) == NB_F32 && nb_array_dtype(in) == NB_I32);
  /* "abcd": targets b c d; the completion targets are c, d (positions 1, 2) */
  check_row(t, 0, 0, "abc...", "bcd...", "011000", "111000");
  check_row(t, 0, 1, "abxy..", "bxyz..", "0111..", "1111..");
  /* "q0123456" cut to T+1 = 7 tokens: "q012345" */
  check_row(t, 1, 0, "q01234", "012345", "111111", "111111");
  check_row(t, 1, 1, "q.....", "r.....", "1.....", "1.....");
  nb_tree_destroy(t);
}

static void test_errors(nb_ctx *ctx) {
  char path[600];
  struct { const char *text; int64_t T, vocab; nb_status st; const char *msg; } cases[] = {
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\nnot json\n", 8, 256, NB_ERR_FORMAT,
       "p.jsonl:2: not a JSON object"},
      {"\n{\"prompt\": \"a\", \"rejected\": \"c\"}\n", 8, 256, NB_ERR_FORMAT, "p.jsonl:2: missing field 'chosen'"},
      {"{\"prompt\": \"a\", \"chosen\": 3, \"rejected\": \"c\"}\n", 8, 256, NB_ERR_FORMAT,
       "p.jsonl:1: field 'chosen' must be a string"},
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"\"}\n", 8, 256, NB_ERR_FORMAT,
       "p.jsonl:1: field 'rejected' is empty"},
      {"{\"prompt\": \"a\", \"chosen\": [{\"role\": \"assistant\", \"content\": \"b\"}], \"rejected\": \"c\"}\n", 8, 256,
       NB_ERR_INVALID_ARG, "p.jsonl:1: messages need a chat template (pref.chat_template)"},
      {"{\"prompt\": \"abcdefgh\", \"chosen\": \"b\", \"rejected\": \"c\"}\n", 8, 256, NB_ERR_INVALID_ARG,
       "p.jsonl:1: field 'prompt' is 8 tokens: seq_len 8 leaves no room"},
      {"{\"prompt\": \"\", \"chosen\": \"b\", \"rejected\": \"c\"}\n", 8, 256, NB_ERR_FORMAT, "p.jsonl:1: field 'prompt' has no tokens"},
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"z\"}\n", 8, 100, NB_ERR_INVALID_ARG,
       "p.jsonl:1: field 'rejected': token id 122 is not below the model's vocab_size 100"},
      {"\n\n", 8, 256, NB_ERR_FORMAT, "no preference pairs"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    nb_tree *t = load(ctx, cases[i].text, cases[i].T, cases[i].vocab, NULL, path);
    CHECK_MSG(t == NULL, "case %zu accepted", i);
    nb_tree_destroy(t);
    CHECK_ERR(ctx, cases[i].st, cases[i].msg);
  }
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  CHECK(nb_pt_pref_data_load(ctx, "/nonexistent/p.jsonl", &tok, 8, 0, NULL) == NULL);
  CHECK_ERR(ctx, NB_ERR_IO, "cannot open '/nonexistent/p.jsonl'");
}

/* ---------------------------------------------------------------- rows given as messages */

static nb_tree *load_chat(nb_ctx *ctx, const char *text, int64_t T, char *path) {
  snprintf(path, 600, "%s/c.jsonl", dir);
  nb_test_write_text(path, text);
  nb_data_tokenizer tok = nb_data_tokenizer_bytes();
  nb_pt_pref_data_opts o = {.chat = NB_SERVE_CHAT_CHATML, .bos_id = 1};
  return nb_pt_pref_data_load_opts(ctx, path, &tok, T, 256, &o, NULL);
}

/* row (pair, side) against BOS + the hand-rendered prompt bytes, then the completion's */
static void check_chat_row(const nb_tree *t, int64_t pair, int side, int64_t T, const char *prompt, const char *completion) {
  int32_t seq[256];
  int64_t np = 0, n = 0;
  seq[n++] = 1;
  for (const char *c = prompt; *c; c++) seq[n++] = (unsigned char)*c;
  np = n;
  for (const char *c = completion; *c; c++) seq[n++] = (unsigned char)*c;
  const nb_array *a[4] = {nb_tree_get_array(t, "inputs"), nb_tree_get_array(t, "targets"), nb_tree_get_array(t, "mask"),
                          nb_tree_get_array(t, "valid")};
  int64_t o = (pair * 2 + side) * T, bad = -1;
  for (int64_t i = 0; i < T && bad < 0; i++) {
    bool has = i < n - 1;
    if (nb_array_get(a[0], o + i) != (has ? seq[i] : 0) || nb_array_get(a[1], o + i) != (has ? seq[i + 1] : 0) ||
        nb_array_get(a[2], o + i) != (has && i + 1 >= np) || nb_array_get(a[3], o + i) != has)
      bad = i;
  }
  CHECK_MSG(bad < 0, "pair %lld side %d differs from the hand-rendered row at position %lld", (long long)pair, side, (long long)bad);
}

#define MSG(role, text) "{\"role\": \"" role "\", \"content\": \"" text "\"}"

static void test_chat_rows(nb_ctx *ctx) {
  char path[600];
  /* explicit prompt; implicit prompt (the shared leading messages, an assistant turn among them) */
  nb_tree *t = load_chat(ctx,
                         "{\"prompt\": [" MSG("user", "hi") "], \"chosen\": [" MSG("assistant", "yes") "], \"rejected\": ["
                         MSG("assistant", "no") "]}\n"
                         "{\"chosen\": [" MSG("system", "be brief") ", " MSG("user", "q1") ", " MSG("assistant", "a1") ", "
                         MSG("user", "q2") ", " MSG("assistant", "good") "], \"rejected\": [" MSG("system", "be brief") ", "
                         MSG("user", "q1") ", " MSG("assistant", "a1") ", " MSG("user", "q2") ", " MSG("assistant", "bad") "]}\n",
                         160, path);
  CHECK_MSG(t, "%s", nb_ctx_error(ctx));
  if (t) {
    const char *p0 = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    check_chat_row(t, 0, 0, 160, p0, "yes<|im_end|>\n");
    check_chat_row(t, 0, 1, 160, p0, "no<|im_end|>\n");
    const char *p1 = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                     "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n";
    check_chat_row(t, 1, 0, 160, p1, "good<|im_end|>\n");
    check_chat_row(t, 1, 1, 160, p1, "bad<|im_end|>\n");
  }
  nb_tree_destroy(t);
  struct { const char *text; const char *msg; } bad[] = {
      {"{\"prompt\": [" MSG("user", "hi") "], \"chosen\": [" MSG("user", "yes") "], \"rejected\": [" MSG("assistant", "no") "]}\n",
       "c.jsonl:1: chosen[0].role 'user': a completion holds assistant messages only"},
      {"{\"prompt\": [" MSG("user", "hi") "], \"chosen\": \"yes\", \"rejected\": [" MSG("assistant", "no") "]}\n",
       "c.jsonl:1: field 'chosen' is not a list of messages but 'prompt' is"},
      {"\n{\"chosen\": [" MSG("user", "a") ", " MSG("assistant", "b") "], \"rejected\": [" MSG("user", "c") ", "
       MSG("assistant", "d") "]}\n",
       "c.jsonl:2: missing field 'prompt' (and chosen and rejected share no leading message"},
      {"{\"prompt\": [" MSG("robot", "hi") "], \"chosen\": [" MSG("assistant", "yes") "], \"rejected\": [" MSG("assistant", "no") "]}\n",
       "c.jsonl:1: chosen (prompt + chosen): messages[0].role 'robot' is not system, user or assistant"},
      {"{\"prompt\": [" MSG("user", "hi") "], \"chosen\": [{\"role\": \"assistant\"}], \"rejected\": [" MSG("assistant", "no") "]}\n",
       "c.jsonl:1: chosen[0].content: must be a string"},
      {"{\"prompt\": [" MSG("user", "hi") "], \"chosen\": [], \"rejected\": [" MSG("assistant", "no") "]}\n",
       "c.jsonl:1: field 'chosen' has no message after the prompt"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    nb_tree *b = load_chat(ctx, bad[i].text, 160, path);
    CHECK_MSG(!b, "bad chat row %zu accepted", i);
    nb_tree_destroy(b);
    CHECK_MSG(strstr(nb_ctx_error(ctx), bad[i].msg), "bad chat row %zu: '%s' lacks '%s'", i, nb_ctx_error(ctx), bad[i].msg);
  }
}

static nb_status rows_fn(nb_graph *g, const nb_tree *in, nb_tree *out, void *u) {
  return nb_tree_set_val(out, "r", nb_pt_pref_rows(nb_tree_get_val(in, "x")));
}

static void test_rows_layout(nb_ctx *ctx) {
  int64_t d[3] = {3, 2, 2};
  nb_tree *in = nb_tree_create(ctx);
  nb_array *x = nb_array_iota(ctx, NB_I32, 3, d, 0); /* pair index */
  nb_array *y = nb_array_iota(ctx, NB_I32, 3, d, 1); /* 0 chosen, 1 rejected */
  nb_tree_set_array(in, "x", x);
  nb_array *r = nb_test_eval_output(ctx, rows_fn, NULL, in, "r");
  nb_tree_set_array(in, "x", y);
  nb_array *s = nb_test_eval_output(ctx, rows_fn, NULL, in, "r");
  CHECK(r && s && nb_array_rank(r) == 2 && nb_array_dims(r)[0] == 6 && nb_array_dims(r)[1] == 2);
  for (int64_t i = 0; r && s && i < 6; i++) {
    CHECK_MSG(nb_array_get(r, 2 * i) == (double)(i % 3), "row %lld holds pair %g", (long long)i, nb_array_get(r, 2 * i));
    CHECK_MSG(nb_array_get(s, 2 * i) == (double)(i >= 3), "row %lld: chosen/rejected %g", (long long)i, nb_array_get(s, 2 * i));
  }
  nb_array_release(x);
  nb_array_release(y);
  nb_array_release(r);
  nb_array_release(s);
  nb_tree_destroy(in);
}

int main(void) {
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "prefdata");
  nb_ctx *ctx = nb_ctx_create();
  test_rows(ctx);
  test_errors(ctx);
  test_chat_rows(ctx);
  test_rows_layout(ctx);
  CHECK(nb_ctx_bytes_in_use(ctx) == 0);
  nb_ctx_destroy(ctx);
  nb_test_rm_rf(dir);
  return nb_test_summary("posttrain/test_pref_data");
}
