/* SFT data: JSONL lines (chat messages rendered by the serve library's
 * template, prompt/completion) to ids with the mask of trained tokens
 * (exactly the assistant turns / the completion and EOS), truncation, the
 * map dataset's next-token pairs, packing into rows with segment ids, and
 * bad lines refused naming file:line and the field. */
#include "test.h"
#include "testfs.h"

#include <unistd.h>

#include "nabla/posttrain.h"

/* the bytes of the trained tokens of a byte-level example, '|' between runs */
static void trained_text(const nb_pt_sft_example *e, char *out, size_t cap) {
  size_t n = 0;
  for (int64_t i = 0; i < e->len && n + 2 < cap; i++) {
    if (e->train[i] && i && !e->train[i - 1] && n) out[n++] = '|';
    if (e->train[i]) out[n++] = e->ids[i] < 256 ? (char)e->ids[i] : '#';
  }
  out[n] = 0;
}

static void test_load(nb_ctx *ctx) {
  nb_test_write_text("sft.jsonl",
                     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"hi\"}, "
                     "{\"role\": \"assistant\", \"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"q\"}, "
                     "{\"role\": \"assistant\", \"content\": \"ok\"}]}\n"
                     "\n"
                     "{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n");
  nb_pt_sft_data_opts o = {.chat = NB_SERVE_CHAT_CHATML, .bos_id = 300, .eos_id = 301};
  nb_pt_sft_data d;
  CHECK_OK(ctx, nb_pt_sft_load(ctx, "sft.jsonl", &o, &d));
  CHECK(d.n == 2);
  if (d.n == 2) {
    char t[256];
    trained_text(&d.ex[0], t, sizeof t);
    CHECK_MSG(!strcmp(t, "yo<|im_end|>|ok<|im_end|>"), "messages: trained on '%s'", t);
    /* chatml: the caller's BOS first; the whole rendered text follows */
    const char *want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
                       "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n";
    CHECK(d.ex[0].len == 1 + (int64_t)strlen(want) && d.ex[0].ids[0] == 300);
    bool same = true;
    for (int64_t i = 1; i < d.ex[0].len; i++) same &= d.ex[0].ids[i] == (unsigned char)want[i - 1];
    CHECK(same);
    trained_text(&d.ex[1], t, sizeof t);
    CHECK_MSG(!strcmp(t, "4#"), "prompt/completion: trained on '%s' (the completion and EOS)", t);
    CHECK(d.ex[1].len == 1 + 4 + 1 + 1 && d.ex[1].ids[0] == 300 && d.ex[1].ids[6] == 301 && !d.ex[1].train[4]);
    CHECK(d.tokens == d.ex[0].len + d.ex[1].len && d.train_tokens == 24 + 2);
  }

  /* the map's next-token pairs: mask[i] is train[i + 1] */
  nb_data_map *m = nb_pt_sft_map(ctx, &d);
  nb_data_elem e = NB_DATA_ELEM_INIT;
  CHECK_OK(ctx, nb_data_map_get(m, 1, &e));
  nb_array *in = e.tree ? nb_tree_get_array(e.tree, "inputs") : NULL, *tg = e.tree ? nb_tree_get_array(e.tree, "targets") : NULL,
           *mk = e.tree ? nb_tree_get_array(e.tree, "mask") : NULL;
  CHECK(in && tg && mk && nb_array_size(in) == 6 && nb_array_get(in, 0) == 300 && nb_array_get(tg, 5) == 301);
  for (int64_t i = 0; mk && i < 6; i++) CHECK(nb_array_get(mk, i) == (i >= 4 ? 1 : 0));
  nb_data_elem_clear(ctx, &e);

  /* packed into 2 rows of 160: both examples, their segments and the mask (0 on padding) */
  nb_data_iter *it = nb_data_iter_pack(nb_data_iter_create(m), &(nb_data_pack_opts){.seq_len = 160, .rows = 2});
  CHECK_OK(ctx, nb_data_iter_next(it, &e));
  nb_array *seg = e.tree ? nb_tree_get_array(e.tree, "segment_ids") : NULL, *pos = e.tree ? nb_tree_get_array(e.tree, "positions") : NULL;
  mk = e.tree ? nb_tree_get_array(e.tree, "mask") : NULL;
  double masked = 0;
  int64_t segs = 0;
  for (int64_t i = 0; mk && seg && i < nb_array_size(mk); i++) {
    masked += nb_array_get(mk, i);
    if (nb_array_get(mk, i)) CHECK(nb_array_get(seg, i) > 0);
    segs += pos && nb_array_get(seg, i) > 0 && nb_array_get(pos, i) == 0; /* a segment starts */
  }
  CHECK_MSG(masked == 2 + 24 && segs == 2, "packed: %g masked targets, %lld segments", masked, (long long)segs);
  nb_data_elem_clear(ctx, &e);
  nb_data_iter_destroy(it);

  /* truncation */
  nb_pt_sft_data_free(&d);
  o.max_len = 10;
  CHECK_OK(ctx, nb_pt_sft_load(ctx, "sft.jsonl", &o, &d));
  CHECK(d.n == 2 && d.ex[0].len == 10 && d.ex[1].len == 7);
  nb_pt_sft_data_free(&d);
  nb_pt_sft_data_free(&d);
}

static void test_bad_lines(nb_ctx *ctx) {
  static const struct {
    const char *line, *needle;
  } bad[] = {
      {"{\"prompt\": \"a\"", "bad.jsonl:2: not a JSON object"},
      {"[1, 2]", "bad.jsonl:2: not a JSON object"},
      {"{\"text\": \"a\"}", "bad.jsonl:2: neither 'messages' nor 'prompt'/'completion'"},
      {"{\"prompt\": 3, \"completion\": \"x\"}", "bad.jsonl:2: prompt: must be a string"},
      {"{\"prompt\": \"a\", \"completion\": \"\"}", "bad.jsonl:2: completion: empty"},
      {"{\"messages\": []}", "bad.jsonl:2: messages: must be a non-empty array"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "bad.jsonl:2: messages[0].content: must be a string"},
      {"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
       "bad.jsonl:2: messages[0].role 'robot' is not system, user or assistant"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "bad.jsonl:2: messages: no assistant message"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"y\"}", "bad.jsonl:2: messages: given with prompt"},
  };
  nb_pt_sft_data_opts o = {.chat = NB_SERVE_CHAT_CHATML, .bos_id = -1, .eos_id = -1};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char text[512];
    snprintf(text, sizeof text, "{\"prompt\": \"a\", \"completion\": \"b\"}\n%s\n", bad[i].line);
    nb_test_write_text("bad.jsonl", text);
    nb_pt_sft_data d;
    CHECK_MSG(nb_pt_sft_load(ctx, "bad.jsonl", &o, &d) != NB_OK && d.n == 0, "case %zu accepted", i);
    CHECK_MSG(strstr(nb_ctx_error(ctx), bad[i].needle), "case %zu: '%s' lacks '%s'", i, nb_ctx_error(ctx), bad[i].needle);
  }
  nb_test_write_text("bad.jsonl", "\n\n");
  nb_pt_sft_data d;
  CHECK(nb_pt_sft_load(ctx, "bad.jsonl", &o, &d) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "holds no example");
  CHECK(nb_pt_sft_load(ctx, "missing.jsonl", &o, &d) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_IO, "missing.jsonl");
  o.chat = NB_SERVE_CHAT_NONE;
  nb_test_write_text("bad.jsonl", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n");
  CHECK(nb_pt_sft_load(ctx, "bad.jsonl", &o, &d) != NB_OK);
  CHECK_ERR(ctx, NB_ERR_INVALID_ARG, "bad.jsonl:1: messages: no chat template");
}

int main(void) {
  nb_ctx *ctx = nb_ctx_create();
  char dir[512], cwd[4096];
  nb_test_scratch_dir(dir, sizeof dir, "posttrain", "sft_data");
  if (!getcwd(cwd, sizeof cwd) || chdir(dir)) return 1;
  test_load(ctx);
  test_bad_lines(ctx);
  if (chdir(cwd)) return 1;
  nb_test_rm_rf(dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("posttrain/test_sft_data");
}
