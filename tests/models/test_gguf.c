/* GGUF in and out, checked against llama.cpp (goldens written by
 * tests/models/golden/make_gguf_llamacpp.py through llama-cpp-python):
 *   - a small Llama with weights from a fixed integer formula (the same on
 *     every machine) is written by nb_model_save_gguf as F32, F16, Q8_0 and
 *     Q4_0; nabla's logits of each file (loaded back through
 *     nb_model_load_gguf) match llama.cpp's logits of the same file within
 *     the format's tolerance, and the F32 file loads back bit-exactly (the
 *     q/k permutation and its inverse included);
 *   - GGUF files written by gguf-py (as llama.cpp's converter writes them,
 *     q/k rows permuted) with a SentencePiece ("llama") and a byte-level
 *     ("gpt2") vocabulary: nabla's token ids of test texts equal llama.cpp's
 *     and its logits match;
 *   - a Q4_K_M file llama.cpp's own quantizer wrote (Q4_K, Q6_K) decodes to
 *     exactly what llama.cpp computes with;
 *   - nabla's SentencePiece-style tokenizers exported as "llama"
 *     vocabularies tokenize the tokenizer tests' texts as llama.cpp does;
 *   - malformed models are refused naming the key or tensor.
 * `models_test_gguf --write DIR` writes the four exported files (what the
 * golden script feeds llama.cpp) and exits. */
#include <unistd.h>

#include "json_golden.h"
#include "testfs.h"

#define GOLDEN "tests/models/golden/gguf_llamacpp.json"

static const struct {
  const char *name;
  nb_gguf_type type;
  double tol; /* max |nabla - llama.cpp| over max |logit| */
  bool gpt2;
  int64_t width; /* 0: 64 */
} formats[] = {
    /* ggml's f32 matmul and nabla's differ in summation order only */
    {"f32", NB_GGUF_F32, 1e-4, false, 0},
    /* ggml rounds the activations to f16 before an f16 matmul (measured
     * 1.5e-3 relative) */
    {"f16", NB_GGUF_F16, 5e-3, false, 0},
    /* ggml quantizes the activations to Q8_0 blocks for Q8_0 / Q4_0
     * weights (up to 1/254 of a block's largest value per element,
     * accumulating over the layers); nabla multiplies the dequantized
     * weights in f32. Measured 3.2% and 1.7% of the largest logit, exactly
     * llama.cpp's own difference between the quantized file and an F32
     * copy of its dequantized weights (which nabla matches to 1e-4 below) */
    {"q8_0", NB_GGUF_Q8_0, 5e-2, false, 0},
    {"q4_0", NB_GGUF_Q4_0, 5e-2, false, 0},
    /* GPT-2 (fused attn_qkv, biases, learned positions, tied head): ggml's
     * GELU reads an f16 table: measured 2.5e-4 even for F32 */
    {"gpt2_f32", NB_GGUF_F32, 1e-3, true, 0},
    {"gpt2_q8_0", NB_GGUF_Q8_0, 5e-2, true, 0},
    /* Q4_K needs rows of 256: a wider Llama; ggml quantizes the activations
     * to Q8_K for it */
    {"q4_k", NB_GGUF_Q4_K, 1e-1, false, 256},
};

/* Width 64 and d_ff 128 (multiples of 32, so every linear quantizes); the
 * Llama has GQA with 2 KV heads (the K permutation uses the KV head count)
 * and an untied head, the GPT-2 ties its head to the embedding. */
static nb_model_config model_config(bool gpt2, int64_t width) {
  nb_model_config c;
  nb_model_config_preset(NULL, gpt2 ? "gpt2-tiny" : "llama-tiny", &c);
  c.vocab_size = 96;
  c.d_model = width ? width : 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = gpt2 ? 4 : 2;
  c.d_ff = width ? width : 128;
  c.max_seq_len = 64;
  c.norm_eps = 1e-5;
  c.rope_cfg.theta = 10000;
  return c;
}

/* weights: a hash of (tensor index, element index) scaled into +-0.25
 * (norm scales 1 +- 0.25): exact integers over 1024, so no libm or
 * random-number code can make two machines differ */
static nb_tree *model_params(nb_ctx *ctx, const nb_model_config *c) {
  nb_tree *spec = nb_model_param_spec(ctx, c, NB_F32), *p = nb_tree_create(ctx);
  for (size_t k = 0; k < nb_tree_size(spec); k++) {
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(spec, k));
    nb_array *a = nb_array_empty(ctx, NB_F32, av.shape.rank, av.shape.dims);
    float *d = nb_array_data_mut(a);
    bool norm = strstr(nb_tree_path(spec, k), "norm") != NULL;
    for (int64_t i = 0; i < nb_array_size(a); i++) {
      uint64_t h = (k + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31, h *= 0x94d049bb133111ebull, h ^= h >> 29;
      d[i] = (float)((int)(h % 513) - 256) / 1024 + (norm ? 1 : 0);
    }
    nb_tree_set_array(p, nb_tree_path(spec, k), a);
    nb_array_release(a);
  }
  nb_tree_destroy(spec);
  return p;
}

static nb_array *forward(nb_ctx *ctx, const nb_model_loaded *m, const int32_t *ids, int n) {
  nb_array *tok = nb_array_create(ctx, NB_I32, 2, (int64_t[2]){1, n}, ids);
  nb_tree *batch = nb_tree_create(ctx), *in = nb_tree_create(ctx), *out = nb_tree_create(ctx);
  nb_tree_set_array(batch, "inputs", tok);
  nb_graph *g = nb_model_trace_forward(ctx, &m->cfg, NULL, m->params, batch);
  CHECK_MSG(g, "%s", nb_ctx_error(ctx));
  nb_tree_merge(in, "params", m->params);
  nb_tree_merge(in, "batch", batch);
  if (g) CHECK_OK(ctx, nb_graph_run(ctx, g, in, out));
  nb_array *logits = nb_tree_get_array(out, "logits");
  if (logits) nb_array_retain(logits);
  nb_graph_destroy(g);
  nb_tree_destroy(batch);
  nb_tree_destroy(in);
  nb_tree_destroy(out);
  nb_array_release(tok);
  return logits;
}

/* nabla's logits against the golden's, relative to the largest logit */
static void check_logits(const char *what, const nb_array *got, const cJSON *want, double tol) {
  CHECK_MSG(got && cJSON_IsArray(want) && nb_array_size(got) == cJSON_GetArraySize(want), "%s: logits count", what);
  if (!got || !cJSON_IsArray(want)) return;
  double maxd = 0, maxv = 0;
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, want) {
    if (i >= nb_array_size(got)) break;
    maxd = fmax(maxd, fabs(nb_array_get(got, i) - v->valuedouble));
    maxv = fmax(maxv, fabs(v->valuedouble));
    i++;
  }
  printf("%-10s %d logits up to %.3g, max |nabla - reference| = %.3g (%.2g relative, tolerance %.0e)\n", what, i, maxv, maxd,
         maxd / maxv, tol);
  CHECK_MSG(maxd <= tol * maxv, "%s: logits differ from llama.cpp's by %g (max logit %g)", what, maxd, maxv);
}

/* SentencePiece-style tokenizers written into GGUF files (as llama.cpp's
 * "llama" vocabulary) with a small model of their vocabulary size */
static const struct {
  const char *name, *tokenizer;
} tok_exports[] = {
    {"tok_spm", "tests/tokenizer/golden/spm/tokenizer.model"},          /* a SentencePiece BPE .model */
    {"tok_spm_ws", "tests/tokenizer/golden/spm_ws/tokenizer.model"},    /* ... with whitespace-only pieces */
    {"tok_hf_llama", "tests/tokenizer/golden/llama/tokenizer.json"},    /* Llama-2's tokenizer.json layout */
};

static int write_tok_exports(nb_ctx *ctx, const char *dir) {
  int rc = 0;
  for (size_t k = 0; k < sizeof tok_exports / sizeof *tok_exports; k++) {
    nb_model_loaded m = {.cfg = model_config(false, 0), .bos_id = -1};
    m.tok = nb_tok_load(ctx, tok_exports[k].tokenizer);
    if (!m.tok) {
      fprintf(stderr, "%s: %s\n", tok_exports[k].tokenizer, nb_ctx_error(ctx));
      rc = 1;
      continue;
    }
    m.cfg.vocab_size = nb_tok_vocab_size(m.tok);
    m.cfg.n_layers = 1;
    m.params = model_params(ctx, &m.cfg);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, tok_exports[k].name);
    if (nb_model_save_gguf(ctx, &m, path, NULL)) fprintf(stderr, "%s: %s\n", path, nb_ctx_error(ctx)), rc = 1;
    nb_model_loaded_free(&m);
  }
  return rc;
}

/* nabla's ids of each text with the original tokenizer, with the one read
 * back from the GGUF file, and llama.cpp's with that file, all equal */
static void test_tok_exports(nb_ctx *ctx, const cJSON *golden, const char *tmp) {
  CHECK(write_tok_exports(ctx, tmp) == 0);
  cJSON *texts = nb_test_golden_load("tests/tokenizer/golden/texts.json");
  const cJSON *hex = cJSON_GetObjectItemCaseSensitive(texts, "texts"), *tg = cJSON_GetObjectItemCaseSensitive(golden, "tok_exports");
  for (size_t k = 0; k < sizeof tok_exports / sizeof *tok_exports; k++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.gguf", tmp, tok_exports[k].name);
    nb_tok *orig = nb_tok_load(ctx, tok_exports[k].tokenizer);
    nb_model_loaded m;
    CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &m));
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(tg, tok_exports[k].name), *h;
    CHECK_MSG(orig && m.tok && cJSON_GetArraySize(want) == cJSON_GetArraySize(hex) && cJSON_GetArraySize(hex) > 0, "%s", tok_exports[k].name);
    int i = 0, same_llama = 0, same_back = 0;
    cJSON_ArrayForEach(h, hex) {
      const char *hx = cJSON_GetStringValue(h);
      char text[4096];
      size_t n = 0;
      for (; hx && hx[2 * n] && hx[2 * n + 1] && n < sizeof text - 1; n++) sscanf(hx + 2 * n, "%2hhx", (unsigned char *)&text[n]);
      nb_tok_ids a = {0}, b = {0};
      nb_tok_encode_opts o = {.special = NB_TOK_SPECIAL_AS_TEXT};
      if (orig) CHECK_OK(ctx, nb_tok_encode(orig, text, n, &o, &a));
      if (m.tok) CHECK_OK(ctx, nb_tok_encode(m.tok, text, n, &o, &b));
      bool back = a.len == b.len && !memcmp(a.ids, b.ids, a.len * sizeof *a.ids);
      const cJSON *w = cJSON_GetArrayItem(want, i), *v;
      bool llama = cJSON_GetArraySize(w) == (int)a.len;
      int j = 0;
      cJSON_ArrayForEach(v, w) llama = llama && j < (int)a.len && v->valueint == a.ids[j++];
      same_back += back, same_llama += llama;
      if (!llama) fprintf(stderr, "%s: text %d: nabla's %zu ids differ from llama.cpp's %d\n", tok_exports[k].name, i, a.len, cJSON_GetArraySize(w));
      if (!back) {
        fprintf(stderr, "%s: text %d '%.40s': read back: %zu ids, originally %zu:", tok_exports[k].name, i, text, b.len, a.len);
        for (size_t q = 0; q < a.len || q < b.len; q++) fprintf(stderr, " %d/%d", q < a.len ? a.ids[q] : -1, q < b.len ? b.ids[q] : -1);
        fputc('\n', stderr);
      }
      if (orig) nb_tok_ids_free(orig, &a);
      if (m.tok) nb_tok_ids_free(m.tok, &b);
      i++;
    }
    printf("%-12s %d texts: %d read back the same, %d equal llama.cpp's ids\n", tok_exports[k].name, i, same_back, same_llama);
    /* Known: in the tokenizer.json fixture a merge forms "</s>" (a control
     * token) from "</" + "s>" and another merges it on ("▁text</s>", text
     * 17). llama.cpp merges through control pieces; nabla's SentencePiece
     * tokenizer, like sentencepiece itself, never forms them. */
    int known = !strcmp(tok_exports[k].name, "tok_hf_llama");
    CHECK(same_back == i - known && same_llama == i);
    nb_model_loaded_free(&m);
    nb_tok_destroy(orig);
  }
  cJSON_Delete(texts);
}

#define HF_DIR "tests/models/golden/hf_llama_tiny" /* transformers' tiny Llama (test_generate_hf.c) */

static int write_exports(nb_ctx *ctx, const char *dir) {
  int rc = 0;
  /* the Hugging Face Llama (Llama-3.1 RoPE scaling, byte-level BPE with
   * Llama-3's split pattern) as nabla exports it */
  nb_model_loaded hf;
  char path[4200];
  snprintf(path, sizeof path, "%s/hf_tiny.gguf", dir);
  if (nb_model_load_hf(ctx, HF_DIR, &hf) || nb_model_save_gguf(ctx, &hf, path, NULL))
    fprintf(stderr, "%s: %s\n", path, nb_ctx_error(ctx)), rc = 1;
  nb_model_loaded_free(&hf);
  for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
    nb_model_loaded m = {.cfg = model_config(formats[f].gpt2, formats[f].width), .bos_id = -1};
    m.params = model_params(ctx, &m.cfg);
    snprintf(path, sizeof path, "%s/%s.gguf", dir, formats[f].name);
    if (nb_model_save_gguf(ctx, &m, path, &(nb_model_gguf_opts){.type = formats[f].type, .name = "nabla-gguf-test"}))
      fprintf(stderr, "%s: %s\n", path, nb_ctx_error(ctx)), rc = 1;
    nb_tree_destroy(m.params);
  }
  return rc;
}

static void test_exports(nb_ctx *ctx, const cJSON *golden, const char *tmp) {
  CHECK(write_exports(ctx, tmp) == 0);
  int64_t ids64[64];
  int n = nb_test_golden_ints(golden, "prompt_ids", ids64, 64);
  int32_t ids[64];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)ids64[i];
  CHECK(n > 1);
  const cJSON *exports = cJSON_GetObjectItemCaseSensitive(golden, "exports");
  for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.gguf", tmp, formats[f].name);
    nb_model_loaded m;
    CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &m));
    if (!m.params) continue;
    bool gpt2 = formats[f].gpt2;
    nb_model_config c = model_config(gpt2, formats[f].width);
    CHECK(m.cfg.family == c.family && m.cfg.d_model == c.d_model && m.cfg.n_layers == 2 && m.cfg.n_heads == 4 &&
          m.cfg.n_kv_heads == c.n_kv_heads && m.cfg.d_ff == c.d_ff && m.cfg.vocab_size == 96 && m.cfg.max_seq_len == 64 &&
          m.cfg.tie_embeddings == gpt2 && m.tok == NULL);
    nb_tree *orig = model_params(ctx, &c);
    /* llama.cpp's choice of types: norms F32, the output projection Q6_K
     * next to Q4 weights when its rows allow, Q8_0 otherwise */
    nb_gguf *gf = nb_gguf_open(ctx, path);
    const nb_gguf_tensor *norm = gf ? nb_gguf_find_tensor(gf, "blk.0.attn_norm.weight") : NULL;
    const nb_gguf_tensor *up = gf ? nb_gguf_find_tensor(gf, "blk.0.ffn_up.weight") : NULL;
    const nb_gguf_tensor *head = gf ? nb_gguf_find_tensor(gf, gpt2 ? "token_embd.weight" : "output.weight") : NULL;
    nb_gguf_type t = formats[f].type;
    nb_gguf_type want_head = t == NB_GGUF_Q4_K ? NB_GGUF_Q6_K : t == NB_GGUF_Q4_0 ? NB_GGUF_Q8_0 : t;
    CHECK_MSG(norm && up && head && norm->type == NB_GGUF_F32 && up->type == t && head->type == want_head, "%s: tensor types",
              formats[f].name);
    nb_gguf_close(gf);
    if (formats[f].type == NB_GGUF_F32)
      for (size_t k = 0; k < nb_tree_size(orig); k++) {
        const char *p = nb_tree_path(orig, k);
        nb_array *got = nb_tree_get_array(m.params, p);
        CHECK_MSG(got && nb_array_equal(got, nb_tree_leaf(orig, k)->array), "f32 round trip of '%s'", p);
      }
    nb_array *logits = n > 1 ? forward(ctx, &m, ids, n) : NULL;
    char what[32];
    snprintf(what, sizeof what, "export %s", formats[f].name);
    check_logits(what, logits, cJSON_GetObjectItemCaseSensitive(exports, formats[f].name), formats[f].tol);
    /* the same weights, activations unquantized on llama.cpp's side: nabla
     * decodes exactly what llama.cpp reads */
    char key[32];
    snprintf(key, sizeof key, "%s_as_f32", formats[f].name);
    snprintf(what, sizeof what, "%s as f32", formats[f].name);
    check_logits(what, logits, cJSON_GetObjectItemCaseSensitive(exports, key), gpt2 ? 1e-3 : 1e-4);
    nb_array_release(logits);
    nb_model_loaded_free(&m);
    nb_tree_destroy(orig);
  }
}

/* a gguf-py-written model with a vocabulary: llama.cpp's ids and logits */
static void test_vocab_model(nb_ctx *ctx, const cJSON *golden, const char *key) {
  const cJSON *g = cJSON_GetObjectItemCaseSensitive(golden, key);
  const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "file"));
  CHECK_MSG(file != NULL, "golden '%s' missing", key);
  if (!file) return;
  char path[4200];
  snprintf(path, sizeof path, "tests/models/golden/%s", file);
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &m));
  if (!m.params) return;
  CHECK(m.tok != NULL);
  const cJSON *texts = cJSON_GetObjectItemCaseSensitive(g, "texts"), *t;
  cJSON_ArrayForEach(t, texts) {
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "text"));
    int64_t want[256];
    int n = nb_test_golden_ints(t, "ids", want, 256);
    nb_tok_ids ids = {0};
    int32_t all[257];
    int k = 0;
    if (m.bos_id >= 0) all[k++] = m.bos_id;
    if (m.tok && text) CHECK_OK(ctx, nb_tok_encode(m.tok, text, strlen(text), &(nb_tok_encode_opts){.special = NB_TOK_SPECIAL_AS_TEXT}, &ids));
    for (size_t i = 0; i < ids.len && k < 257; i++) all[k++] = ids.ids[i];
    bool same = k == n;
    for (int i = 0; same && i < n; i++) same = all[i] == want[i];
    CHECK_MSG(same, "%s: '%s': nabla's %d ids differ from llama.cpp's %d", key, text ? text : "?", k, n);
    if (!same)
      for (int i = 0; i < k || i < n; i++)
        fprintf(stderr, "  %d: nabla %d llama.cpp %lld\n", i, i < k ? all[i] : -1, i < n ? (long long)want[i] : -1LL);
    /* decoding gives the text back (llama.cpp's detokenizer drops the leading space too) */
    nb_tok_text back = {0};
    if (m.tok && ids.len) CHECK_OK(ctx, nb_tok_decode(m.tok, ids.ids, ids.len, NULL, &back));
    CHECK_MSG(!ids.len || (back.data && !strcmp(back.data, text)), "%s: decode gives '%s' for '%s'", key, back.data ? back.data : "", text);
    nb_tok_text_free(m.tok, &back);
    nb_tok_ids_free(m.tok, &ids);
  }
  int64_t ids64[64];
  int n = nb_test_golden_ints(g, "prompt_ids", ids64, 64);
  int32_t ids[64];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)ids64[i];
  nb_array *logits = n > 0 ? forward(ctx, &m, ids, n) : NULL;
  check_logits(key, logits, cJSON_GetObjectItemCaseSensitive(g, "logits"), 1e-4);
  nb_array_release(logits);
  nb_model_loaded_free(&m);
}

/* `nabla generate --gguf` continues the first text greedily as llama.cpp
 * does; `nabla quantize` re-exports the model (its BPE vocabulary
 * included) to a file that tokenizes and runs the same. */
static void test_cli(nb_ctx *ctx, const cJSON *golden, const char *tmp) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return;
  static const char *const keys[] = {"spm", "bpe"};
  for (int k = 0; k < 2; k++) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(golden, keys[k]);
    const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "texts"), 0);
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "file"));
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t0, "text"));
    int64_t want[16];
    int n = nb_test_golden_ints(g, "greedy", want, 16);
    CHECK(file && text && n == 8);
    if (!file || !text || n != 8) continue;
    char cmd[8192], out[4096], err[8192];
    snprintf(cmd, sizeof cmd, "%s generate --gguf tests/models/golden/%s --prompt '%s' --max-tokens 8 --temperature 0 --show-ids", bin,
             file, text);
    int rc = nb_test_run2(cmd, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", cmd, err);
    char expect[256];
    size_t at = (size_t)snprintf(expect, sizeof expect, "generated ids:");
    for (int i = 0; i < n; i++) at += (size_t)snprintf(expect + at, sizeof expect - at, " %lld", (long long)want[i]);
    CHECK_MSG(strstr(err, expect) != NULL, "%s: llama.cpp's greedy '%s' not in:\n%s", keys[k], expect, err);
  }
  /* serve picks the chat format from tokenizer.chat_template: ChatML's
   * markers in the BPE model's, an unknown one in the SentencePiece's */
  char req[4200];
  snprintf(req, sizeof req, "%s/chat.jsonl", tmp);
  nb_test_write_text(req, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
                          "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}}\n");
  for (int k = 0; k < 2; k++) {
    char cmd2[16384], ans[4200], log[4096];
    snprintf(ans, sizeof ans, "%s/chat_out_%d.jsonl", tmp, k);
    snprintf(cmd2, sizeof cmd2, "%s serve tests/models/golden/%s --served-model-name m --batch %s --output %s 2>&1", bin,
             k ? "spm_tiny.gguf" : "bpe_tiny.gguf", req, ans);
    CHECK_MSG(nb_test_run(cmd2, log, sizeof log) == 0, "%s", log);
    char *got = nb_test_read_file(ans, NULL);
    CHECK_MSG(got && (k ? strstr(got, "chat_template is none nabla knows") != NULL : strstr(got, "\"status_code\":200") != NULL),
              "serve %s chat: %s", k ? "spm" : "bpe", got ? got : "(no output)");
    free(got);
  }
  /* quantize: the BPE model to Q8_0, the vocabulary carried over */
  char cmd[8192], out[4096], err[4096], path[4200];
  snprintf(path, sizeof path, "%s/bpe_q8.gguf", tmp);
  snprintf(cmd, sizeof cmd, "%s quantize tests/models/golden/bpe_tiny.gguf --format gguf --type q8_0 -o %s", bin, path);
  CHECK_MSG(nb_test_run2(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", cmd, err);
  nb_model_loaded a, b;
  CHECK_OK(ctx, nb_model_load_gguf(ctx, "tests/models/golden/bpe_tiny.gguf", &a));
  CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &b));
  if (a.tok && b.tok) {
    const char *text = "Hello, world! \xc3\xbcn the theater<|endoftext|>";
    nb_tok_ids x = {0}, y = {0};
    CHECK_OK(ctx, nb_tok_encode(a.tok, text, strlen(text), NULL, &x));
    CHECK_OK(ctx, nb_tok_encode(b.tok, text, strlen(text), NULL, &y));
    CHECK(x.len == y.len && x.len > 0 && !memcmp(x.ids, y.ids, x.len * sizeof *x.ids));
    CHECK(b.n_eos == 1 && b.eos_ids[0] == a.eos_ids[0] && nb_tok_is_special(b.tok, b.eos_ids[0]));
    nb_tok_ids_free(a.tok, &x);
    nb_tok_ids_free(b.tok, &y);
  }
  CHECK(b.params && nb_tree_size(b.params) == nb_tree_size(a.params));
  nb_model_loaded_free(&a);
  nb_model_loaded_free(&b);
  /* ckpt show: metadata and each tensor's type */
  static char show[1 << 16];
  snprintf(cmd, sizeof cmd, "%s ckpt show %s", bin, path);
  CHECK(nb_test_run(cmd, show, sizeof show) == 0);
  CHECK_MSG(strstr(show, "GGUF version 3, alignment 32") && strstr(show, "tokenizer.ggml.model                             \"gpt2\"") &&
            strstr(show, "tokenizer.ggml.merges                            string[") &&
            strstr(show, "blk.0.attn_q.weight                              Q8_0   [32, 32]") &&
            strstr(show, "blk.0.attn_norm.weight                           F32    [32]"), "%s", show);
  snprintf(cmd, sizeof cmd, "%s quantize tests/models/golden/bpe_tiny.gguf --format gguf --type q5_0 -o %s 2>&1", bin, path);
  CHECK(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "--type 'q5_0': one of f32, f16, bf16, q8_0, q4_0, q4_k"));
}

/* A file llama.cpp's own quantizer wrote (Q4_K_M: Q4_K and Q6_K tensors):
 * nabla decodes what llama.cpp reads (its logits on an F32 copy of the
 * dequantized weights), and stays within the activation-quantization
 * error of llama.cpp's logits on the file itself. */
static void test_llamacpp_quantized(nb_ctx *ctx, const cJSON *golden) {
  const cJSON *g = cJSON_GetObjectItemCaseSensitive(golden, "q4_k_m");
  const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "file"));
  CHECK(file != NULL);
  if (!file) return;
  char path[4200];
  snprintf(path, sizeof path, "tests/models/golden/%s", file);
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &m));
  if (!m.params) return;
  CHECK(m.cfg.d_model == 256 && m.cfg.n_kv_heads == 2 && m.cfg.vocab_size == 64);
  int64_t ids64[16];
  int n = nb_test_golden_ints(g, "prompt_ids", ids64, 16);
  int32_t ids[16];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)ids64[i];
  nb_array *logits = n > 0 ? forward(ctx, &m, ids, n) : NULL;
  check_logits("q4_k_m as f32", logits, cJSON_GetObjectItemCaseSensitive(g, "logits_as_f32"), 1e-4);
  /* ggml quantizes the activations to Q8_K (one scale per 256 values) for
   * K-quant weights: measured 4.9% of the largest logit */
  check_logits("q4_k_m", logits, cJSON_GetObjectItemCaseSensitive(g, "logits"), 1e-1);
  nb_array_release(logits);
  nb_model_loaded_free(&m);
}

/* Hugging Face -> nabla -> GGUF: llama.cpp reads nabla's file as
 * transformers computes the model (logits, prompt ids, greedy ids), and
 * nabla reads it back the same (the RoPE divisors back into Llama-3.1
 * parameters). */
static void test_hf_export(nb_ctx *ctx, const cJSON *golden, const char *tmp) {
  cJSON *hf = nb_test_golden_load("tests/models/golden/hf_llama_tiny.json");
  const cJSON *g = cJSON_GetObjectItemCaseSensitive(golden, "hf_tiny");
  char path[4200];
  snprintf(path, sizeof path, "%s/hf_tiny.gguf", tmp);
  nb_model_loaded m;
  CHECK_OK(ctx, nb_model_load_gguf(ctx, path, &m));
  if (!hf || !m.params) return cJSON_Delete(hf);
  const nb_nn_rope_cfg *r = &m.cfg.rope_cfg;
  CHECK(r->scaling == NB_NN_ROPE_LLAMA3 && r->factor == 8 && m.cfg.vocab_size == 304 && m.tok);
  int64_t ids64[64], want[64], greedy[64], lg[64];
  int n = nb_test_golden_ints(hf, "prompt_ids", ids64, 64);
  int32_t ids[64];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)ids64[i];
  CHECK(n == nb_test_golden_ints(g, "prompt_ids", want, 64) && !memcmp(want, ids64, (size_t)n * sizeof *want));
  int ng = nb_test_golden_ints(hf, "greedy_ids", greedy, 64);
  CHECK_MSG(ng > 0 && ng == nb_test_golden_ints(g, "greedy", lg, 64) && !memcmp(greedy, lg, (size_t)ng * sizeof *lg),
            "llama.cpp's greedy ids differ from transformers' generate()");
  nb_array *logits = n > 0 ? forward(ctx, &m, ids, n) : NULL;
  check_logits("hf vs transformers", logits, cJSON_GetObjectItemCaseSensitive(hf, "logits"), 1e-5);
  check_logits("hf vs llama.cpp", logits, cJSON_GetObjectItemCaseSensitive(g, "logits"), 1e-5);
  /* llama.cpp against transformers, both recorded */
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(g, "logits"), *b = cJSON_GetObjectItemCaseSensitive(hf, "logits");
  double maxd = 0, maxv = 0;
  for (const cJSON *x = a ? a->child : NULL, *y = b ? b->child : NULL; x && y; x = x->next, y = y->next)
    maxd = fmax(maxd, fabs(x->valuedouble - y->valuedouble)), maxv = fmax(maxv, fabs(y->valuedouble));
  printf("hf tiny: llama.cpp on nabla's GGUF vs transformers: max |diff| %.3g (%.2g relative)\n", maxd, maxd / maxv);
  CHECK(cJSON_GetArraySize(a) == cJSON_GetArraySize(b) && maxd <= 1e-5 * maxv);
  nb_array_release(logits);
  nb_model_loaded_free(&m);
  cJSON_Delete(hf);
}

static void expect_refused(nb_ctx *ctx, nb_gguf_writer *w, const char *tmp, nb_status want, const char *needle) {
  char path[4200];
  snprintf(path, sizeof path, "%s/bad.gguf", tmp);
  CHECK_OK(ctx, nb_gguf_writer_save(w, path));
  nb_gguf_writer_destroy(w);
  nb_model_loaded m;
  CHECK(nb_model_load_gguf(ctx, path, &m) == want);
  CHECK(m.params == NULL);
  CHECK_ERR(ctx, want, needle);
}

static nb_gguf_writer *llama_keys(nb_ctx *ctx, const char *skip) {
  nb_gguf_writer *w = nb_gguf_writer_create(ctx);
  nb_gguf_write_string(w, "general.architecture", "llama", 5);
  static const char *const keys[] = {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                                     "llama.attention.head_count", "llama.context_length"};
  static const uint32_t vals[] = {64, 2, 128, 4, 64};
  for (int i = 0; i < 5; i++)
    if (strcmp(keys[i], skip)) nb_gguf_write_u32(w, keys[i], vals[i]);
  if (strcmp(skip, "llama.attention.layer_norm_rms_epsilon")) nb_gguf_write_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  return w;
}

static void test_malformed(nb_ctx *ctx, const char *tmp) {
  nb_gguf_writer *w = nb_gguf_writer_create(ctx);
  nb_gguf_write_string(w, "general.architecture", "falcon", 6);
  expect_refused(ctx, w, tmp, NB_ERR_UNIMPLEMENTED, "key 'general.architecture' is 'falcon'; supported: llama, gpt2");
  expect_refused(ctx, llama_keys(ctx, "llama.block_count"), tmp, NB_ERR_NOT_FOUND, "key 'llama.block_count' is missing");
  w = llama_keys(ctx, "llama.context_length");
  nb_gguf_write_string(w, "llama.context_length", "x", 1);
  expect_refused(ctx, w, tmp, NB_ERR_FORMAT, "key 'llama.context_length' is a STRING, expected an integer");
  expect_refused(ctx, llama_keys(ctx, ""), tmp, NB_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
  /* an embedding but no layers: the first missing tensor is named */
  w = llama_keys(ctx, "");
  nb_array *emb = nb_array_empty(ctx, NB_F32, 2, (int64_t[2]){96, 64});
  memset(nb_array_data_mut(emb), 0, 96 * 64 * 4);
  nb_gguf_write_tensor(w, "token_embd.weight", NB_GGUF_F32, emb);
  expect_refused(ctx, w, tmp, NB_ERR_NOT_FOUND, "tensor 'blk.0.attn_norm.weight'");
  /* a mis-shaped tensor */
  w = llama_keys(ctx, "");
  nb_gguf_write_tensor(w, "token_embd.weight", NB_GGUF_F32, emb);
  nb_gguf_write_tensor(w, "blk.0.attn_norm.weight", NB_GGUF_F32, emb);
  expect_refused(ctx, w, tmp, NB_ERR_SHAPE, "tensor 'blk.0.attn_norm.weight' is [96, 64] (ggml ne reversed), the metadata wants [64]");
  nb_array_release(emb);
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (argc == 3 && !strcmp(argv[1], "--write")) {
    int rc = write_exports(ctx, argv[2]) | write_tok_exports(ctx, argv[2]);
    nb_ctx_destroy(ctx);
    return rc;
  }
  char tmp[4096];
  nb_test_scratch_dir(tmp, sizeof tmp, "models", "gguf");
  cJSON *golden = nb_test_golden_load(GOLDEN);
  CHECK(golden != NULL);
  if (golden) {
    test_exports(ctx, golden, tmp);
    test_vocab_model(ctx, golden, "spm");
    test_vocab_model(ctx, golden, "bpe");
    test_cli(ctx, golden, tmp);
    test_tok_exports(ctx, golden, tmp);
    test_llamacpp_quantized(ctx, golden);
    test_hf_export(ctx, golden, tmp);
  }
  test_malformed(ctx, tmp);
  cJSON_Delete(golden);
  nb_test_rm_rf(tmp);
  nb_ctx_destroy(ctx);
  return nb_test_summary("models/test_gguf");
}
