/* `nabla ckpt`: inspect and convert checkpoints. Subcommands: list (steps of
 * a checkpoint directory), show (a step's, a safetensors file's or a GGUF
 * file's tree),
 * verify (checksums), export (checkpoint -> safetensors) and import
 * (safetensors -> checkpoint). Only the public ckpt API is used. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "nabla/nabla.h"

static const char usage_text[] =
          "usage: nabla ckpt list DIR\n"
          "       nabla ckpt show DIR [STEP|latest]      (DIR: checkpoint dir, step dir, safetensors file/dir/index,\n"
          "                                              or a GGUF file: metadata and each tensor's type)\n"
          "       nabla ckpt verify DIR [STEP|all]\n"
          "       nabla ckpt export DIR STEP|latest OUT [--item NAME] [--hf-names] [--shard-size BYTES]\n"
          "       nabla ckpt export SRC --hf OUT_DIR [--dtype f32|bf16|f16] [--shard-size BYTES] [--arch NAME]\n"
          "                                              (SRC: a run dir, a checkpoint step dir or a Hugging Face dir;\n"
          "                                              writes config.json + safetensors under Hugging Face names)\n"
          "       nabla ckpt import IN DIR --step N [--item NAME] [--hf-names]\n";

static bool help_asked;
static int usage(void) { return nb_cli_usage(usage_text, help_asked); }

static int fail(nb_ctx *ctx, const char *what) {
  fprintf(stderr, "nabla ckpt %s: %s\n", what, nb_ctx_error(ctx));
  nb_ctx_destroy(ctx);
  return 1;
}

static void human(size_t n, char *buf, size_t cap) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

static bool file_exists(const char *dir, const char *name) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* A checkpoint is a directory, so a file (whatever its name) is safetensors
 * or an index (the loader tells them apart by their bytes); a directory is
 * when it holds model.safetensors(.index.json). */
static bool is_safetensors(const char *path) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return true;
  return file_exists(path, "model.safetensors") || file_exists(path, "model.safetensors.index.json");
}

/* STEP or "latest"; prints why a bad one is bad */
static bool parse_step(const char *s, int64_t *step) {
  if (s && !strcmp(s, "latest")) return *step = NB_CKPT_LATEST, true;
  return nb_cli_int("ckpt", "step", s, 0, INT64_MAX, step);
}

static nb_ckpt_manager *open_ro(nb_ctx *ctx, const char *dir) {
  nb_ckpt_options o = {.directory = dir, .read_only = true};
  return nb_ckpt_manager_create(ctx, &o);
}

static int cmd_list(int argc, char **argv) {
  if (argc != 1) return usage();
  nb_ctx *ctx = nb_ctx_create();
  nb_ckpt_manager *m = open_ro(ctx, argv[0]);
  size_t n = 0;
  if (!m || nb_ckpt_all_steps(m, NULL, 0, &n) != NB_OK) return fail(ctx, "list");
  int64_t *steps = calloc(n + 1, sizeof *steps);
  nb_ckpt_all_steps(m, steps, n, &n);
  printf("%-12s %8s %12s  %s\n", "step", "arrays", "size", "metric");
  for (size_t i = 0; i < n; i++) {
    nb_ckpt_info *info = nb_ckpt_info_load(m, steps[i]);
    char size[32], metric[32] = "-";
    double mv;
    if (!info) {
      printf("%-12lld damaged: %s\n", (long long)steps[i], nb_ctx_error(ctx));
      continue;
    }
    human(nb_ckpt_info_total_bytes(info), size, sizeof size);
    if (nb_ckpt_info_metric(info, &mv)) snprintf(metric, sizeof metric, "%g", mv);
    printf("%-12lld %8zu %12s  %s\n", (long long)steps[i], nb_ckpt_info_count(info), size, metric);
    nb_ckpt_info_destroy(info);
  }
  free(steps);
  nb_ckpt_manager_destroy(m);
  nb_ctx_destroy(ctx);
  return 0;
}

static void print_tree(const nb_tree *t) {
  size_t total = 0;
  for (size_t i = 0; i < nb_tree_size(t); i++) {
    nb_aval av = nb_leaf_get_aval(nb_tree_leaf(t, i));
    char s[128];
    size_t bytes = (size_t)nb_shape_size(&av.shape) * nb_dtype_size(av.dtype);
    total += bytes;
    printf("  %-48s %-24s %zu\n", nb_tree_path(t, i), nb_aval_str(&av, s, sizeof s), bytes);
  }
  char h[32];
  human(total, h, sizeof h);
  printf("%zu tensors, %s\n", nb_tree_size(t), h);
}

static int show_safetensors(const char *path) {
  nb_ctx *ctx = nb_ctx_create();
  char *meta = NULL;
  nb_tree *t = nb_ckpt_safetensors_load(ctx, path, NULL, &meta);
  if (!t) return fail(ctx, "show");
  printf("safetensors %s\n", path);
  if (meta) printf("metadata: %s\n", meta);
  print_tree(t);
  nb_ckpt_string_free(ctx, meta);
  nb_tree_destroy(t);
  nb_ctx_destroy(ctx);
  return 0;
}

/* The quantization of "<item>/<m>/kernel/..." as `nabla quantize --rules`
 * records it in the metadata ("quant": {"tensors": {"params/<m>/kernel":
 * description}}), or NULL. */
static const char *quantization_of(const cJSON *tensors, const char *path) {
  const char *slash = strrchr(path, '/');
  if (!tensors || !slash) return NULL;
  char kernel[512];
  snprintf(kernel, sizeof kernel, "%.*s", (int)(slash - path), path);
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(tensors, kernel);
  return cJSON_IsString(d) ? d->valuestring : NULL;
}

static void print_info(const nb_ckpt_info *info) {
  char h[32];
  double mv;
  human(nb_ckpt_info_total_bytes(info), h, sizeof h);
  printf("step %lld: %zu arrays, %s\n", (long long)nb_ckpt_info_step(info), nb_ckpt_info_count(info), h);
  if (nb_ckpt_info_metric(info, &mv)) printf("metric: %g\n", mv);
  const char *meta = nb_ckpt_info_metadata(info);
  if (meta) printf("metadata: %s\n", meta);
  cJSON *mj = meta ? cJSON_Parse(meta) : NULL;
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mj, "quant"), "tensors");
  for (size_t i = 0; i < nb_ckpt_info_count(info); i++) {
    const nb_ckpt_entry *e = nb_ckpt_info_entry(info, i);
    nb_aval av = nb_aval_make(e->dtype, e->shape.rank, e->shape.dims);
    char path[512], s[128];
    snprintf(path, sizeof path, "%s/%s", e->item, e->path);
    const char *q = quantization_of(tensors, path);
    printf("  %-48s %-24s %zu%s%s%s\n", path, nb_aval_str(&av, s, sizeof s), e->nbytes, e->n_shards > 1 ? " (sharded)" : "",
           q ? "  " : "", q ? q : "");
  }
  cJSON_Delete(mj);
}

static const char *const vtype_names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

/* one metadata value on the rest of a line: scalars as is, strings quoted
 * (cut at 60 bytes), arrays as their type and length and first items */
static void print_value(const nb_gguf_value *v) {
  switch (v->type) {
  case NB_GGUF_STRING: printf("\"%.*s%s\"", (int)(v->len < 60 ? v->len : 60), v->str, v->len > 60 ? "..." : ""); break;
  case NB_GGUF_ARRAY:
    printf("%s[%llu]", vtype_names[v->elem], (unsigned long long)v->n);
    for (uint64_t j = 0; j < v->n && j < 4; j++) {
      fputs(j ? ", " : " ", stdout);
      if (v->items) print_value(&v->items[j]);
      else if (v->elem == NB_GGUF_FLOAT32 || v->elem == NB_GGUF_FLOAT64) printf("%g", nb_gguf_array_f64(v, j));
      else printf("%lld", (long long)nb_gguf_array_i64(v, j));
    }
    if (v->n > 4) fputs(", ...", stdout);
    break;
  case NB_GGUF_FLOAT32: case NB_GGUF_FLOAT64: printf("%g", v->f); break;
  case NB_GGUF_BOOL: fputs(v->u ? "true" : "false", stdout); break;
  case NB_GGUF_UINT64: printf("%llu", (unsigned long long)v->u); break;
  default: printf("%lld", (long long)v->i); break;
  }
}

/* A GGUF file: its metadata and each tensor's type (its quantization),
 * shape in nabla's order (ggml's ne reversed) and bytes. */
static int show_gguf(const char *path) {
  nb_ctx *ctx = nb_ctx_create();
  nb_gguf *g = nb_gguf_open(ctx, path);
  if (!g) return fail(ctx, "show");
  printf("GGUF version %u, alignment %llu, %zu metadata keys, %zu tensors\n", nb_gguf_version(g),
         (unsigned long long)nb_gguf_alignment(g), nb_gguf_n_kv(g), nb_gguf_n_tensors(g));
  for (size_t i = 0; i < nb_gguf_n_kv(g); i++) {
    printf("  %-48s ", nb_gguf_kv_key(g, i));
    print_value(nb_gguf_kv_value(g, i));
    putchar('\n');
  }
  size_t total = 0;
  for (size_t i = 0; i < nb_gguf_n_tensors(g); i++) {
    const nb_gguf_tensor *t = nb_gguf_tensor_at(g, i);
    char shape[128], bytes[32];
    size_t n = (size_t)snprintf(shape, sizeof shape, "[");
    for (int d = t->n_dims - 1; d >= 0 && n < sizeof shape; d--)
      n += (size_t)snprintf(shape + n, sizeof shape - n, d == t->n_dims - 1 ? "%lld" : ", %lld", (long long)t->ne[d]);
    if (n < sizeof shape) snprintf(shape + n, sizeof shape - n, "]");
    human((size_t)t->nbytes, bytes, sizeof bytes);
    printf("%-48s %-6s %-20s %s\n", t->name, nb_gguf_type_name(t->type), shape, bytes);
    total += (size_t)t->nbytes;
  }
  char tot[32];
  human(total, tot, sizeof tot);
  printf("total %s of tensor data\n", tot);
  nb_gguf_close(g);
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_show(int argc, char **argv) {
  if (argc < 1 || argc > 2) return usage();
  if (argc == 1 && nb_cli_is_gguf(argv[0])) return show_gguf(argv[0]);
  if (argc == 1 && is_safetensors(argv[0])) return show_safetensors(argv[0]);
  nb_ctx *ctx = nb_ctx_create();
  nb_ckpt_info *info = NULL;
  int64_t step = NB_CKPT_LATEST;
  if (argc == 2 && !parse_step(argv[1], &step)) return 2;
  if (argc == 1 && file_exists(argv[0], "COMMIT")) {
    info = nb_ckpt_info_open(ctx, argv[0]);
  } else {
    nb_ckpt_manager *m = open_ro(ctx, argv[0]);
    info = m ? nb_ckpt_info_load(m, step) : NULL;
    nb_ckpt_manager_destroy(m);
  }
  if (!info) return fail(ctx, "show");
  print_info(info);
  nb_ckpt_info_destroy(info);
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_verify(int argc, char **argv) {
  if (argc < 1 || argc > 2) return usage();
  nb_ctx *ctx = nb_ctx_create();
  if (file_exists(argv[0], "COMMIT")) {
    nb_status s = nb_ckpt_verify_dir(ctx, argv[0]);
    printf("%s: %s\n", argv[0], s == NB_OK ? "ok" : nb_ctx_error(ctx));
    nb_ctx_destroy(ctx);
    return s == NB_OK ? 0 : 1;
  }
  nb_ckpt_manager *m = open_ro(ctx, argv[0]);
  size_t n = 0;
  if (!m || nb_ckpt_all_steps(m, NULL, 0, &n) != NB_OK) return fail(ctx, "verify");
  int64_t *steps = calloc(n + 1, sizeof *steps), one;
  nb_ckpt_all_steps(m, steps, n, &n);
  if (argc == 2 && strcmp(argv[1], "all") != 0) {
    if (!parse_step(argv[1], &one)) return free(steps), nb_ckpt_manager_destroy(m), nb_ctx_destroy(ctx), 2;
    if (one == NB_CKPT_LATEST && nb_ckpt_latest_step(m, &one) != NB_OK) return fail(ctx, "verify");
    steps[0] = one;
    n = 1;
  }
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    nb_status s = nb_ckpt_verify(m, steps[i]);
    printf("step %lld: %s\n", (long long)steps[i], s == NB_OK ? "ok" : nb_ctx_error(ctx));
    bad += s != NB_OK;
  }
  free(steps);
  nb_ckpt_manager_destroy(m);
  nb_ctx_destroy(ctx);
  return bad ? 1 : 0;
}

/* Options shared by export and import. */
typedef struct conv_opts {
  const char *item;
  bool hf;
  size_t shard;
  int64_t step;
  bool has_step;
} conv_opts;

static int parse_conv(int argc, char **argv, int npos, const char **pos, conv_opts *o) {
  int k = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--item") && i + 1 < argc) o->item = argv[++i];
    else if (!strcmp(argv[i], "--hf-names")) o->hf = true;
    else if (!strcmp(argv[i], "--shard-size")) {
      int64_t v;
      if (!nb_cli_int("ckpt", "--shard-size", i + 1 < argc ? argv[++i] : NULL, 1, INT64_MAX, &v)) return -2;
      o->shard = (size_t)v;
    } else if (!strcmp(argv[i], "--step")) {
      if (!nb_cli_int("ckpt", "--step", i + 1 < argc ? argv[++i] : NULL, 0, INT64_MAX, &o->step)) return -2;
      o->has_step = true;
    } else if (argv[i][0] != '-' && k < npos) pos[k++] = argv[i];
    else return -1;
  }
  return k == npos ? 0 : -1;
}

/* ---------------------------------------------------------------- export --hf */

static bool copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
  char buf[65536];
  size_t n;
  bool ok = in && out;
  while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
  if (in) fclose(in);
  if (out && fclose(out)) ok = false;
  return ok;
}

/* The tokenizer and generation files of the folder `dir` that exist, into out */
static int copy_side_files(const char *dir, const char *out) {
  static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                      "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model", NULL};
  int n = 0;
  for (int i = 0; names[i]; i++) {
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/%s", dir, names[i]);
    snprintf(b, sizeof b, "%s/%s", out, names[i]);
    if (access(a, F_OK) != 0) continue;
    if (!copy_file(a, b)) return fprintf(stderr, "nabla ckpt export: cannot copy %s to %s\n", a, b), -1;
    n++;
  }
  return n;
}

static int cmd_export_hf(int argc, char **argv) {
  const char *src = NULL, *out = NULL, *arch = NULL;
  nb_model_hf_opts o = {.dtype = NB_F32};
  for (int i = 0; i < argc; i++) {
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--hf") && next) out = argv[++i];
    else if (!strcmp(argv[i], "--arch") && next) arch = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && next) {
      const char *d = argv[++i];
      if (strcmp(d, "f32") && strcmp(d, "bf16") && strcmp(d, "f16"))
        return fprintf(stderr, "nabla ckpt export: --dtype '%s' is not one of f32, bf16, f16\n", d), 2;
      nb_dtype_from_name(d, &o.dtype);
    } else if (!strcmp(argv[i], "--shard-size")) {
      int64_t v;
      if (!nb_cli_int("ckpt", "--shard-size", next, 1, INT64_MAX, &v)) return 2;
      o.shard_bytes = (size_t)v, i++;
    } else if (argv[i][0] != '-' && !src) src = argv[i];
    else return usage();
  }
  if (!src || !out) return usage();
  if (!nb_cli_output_ok("ckpt export", out, true, 1, &src)) return 2;
  o.arch = arch;
  nb_ctx *ctx = nb_ctx_create();
  nb_model_loaded m;
  char p[4200], tokdir[4200] = "";
  nb_status s;
  snprintf(p, sizeof p, "%s/config.json", src);
  bool hf = access(p, F_OK) == 0;
  snprintf(p, sizeof p, "%s/COMMIT", src);
  bool step = access(p, F_OK) == 0;
  if (hf) {
    s = nb_model_load_hf(ctx, src, &m);
    snprintf(tokdir, sizeof tokdir, "%s", src);
  } else {
    s = step ? nb_train_load_checkpoint(ctx, src, NULL, &m) : nb_train_load_run_dir(ctx, src, NULL, &m);
    /* the run's tokenizer: data.tokenizer, a tokenizer.json whose folder may hold the rest */
    nb_train_config rc;
    snprintf(p, sizeof p, step ? "%s/../../config.yaml" : "%s/config.yaml", src);
    if (!s && nb_train_config_load(ctx, p, 0, NULL, &rc) == NB_OK && rc.data.tokenizer[0]) {
      const char *t = rc.data.tokenizer, *slash = strrchr(t, '/');
      size_t n = strlen(t);
      if (n >= 14 && !strcmp(t + n - 14, "tokenizer.json")) snprintf(tokdir, sizeof tokdir, "%.*s", slash ? (int)(slash - t) : 1, slash ? t : ".");
      else snprintf(tokdir, sizeof tokdir, "%s", t); /* a folder (vocab.json + merges.txt) */
    }
  }
  if (s) return fail(ctx, "export");
  s = nb_model_save_hf(ctx, &m, out, &o);
  size_t n = nb_tree_size(m.params);
  nb_model_loaded_free(&m);
  if (s) return fail(ctx, "export");
  int copied = tokdir[0] ? copy_side_files(tokdir, out) : 0;
  if (copied < 0) return nb_ctx_destroy(ctx), 1;
  printf("wrote %zu parameters as a Hugging Face model (%s) to %s%s\n", n, nb_dtype_name(o.dtype), out,
         copied ? ", with the tokenizer files" : "");
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_export(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--hf")) return cmd_export_hf(argc, argv);
  const char *pos[3];
  conv_opts co = {0};
  int64_t step;
  int pc = parse_conv(argc, argv, 3, pos, &co);
  if (pc == -2) return 2;
  if (pc != 0) return usage();
  if (!parse_step(pos[1], &step)) return 2;
  /* the safetensors file (or shard directory) must not go into the checkpoint it reads */
  if (!nb_cli_output_ok("ckpt export", pos[2], false, 1, pos)) return 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_ckpt_manager *m = open_ro(ctx, pos[0]);
  const char *items[1] = {co.item};
  nb_ckpt_restore_opts ro = {.items = co.item ? items : NULL, .n_items = co.item ? 1 : 0};
  nb_tree *t = m ? nb_ckpt_restore(m, step, &ro) : NULL;
  nb_ckpt_manager_destroy(m);
  if (!t) return fail(ctx, "export");
  if (co.item) { /* the item's own paths, without "item/" */
    nb_tree *sub = nb_tree_select_prefix(t, co.item, true);
    nb_tree_destroy(t);
    t = sub;
  }
  nb_ckpt_st_opts so = {.hf_names = co.hf};
  nb_status s = co.shard ? nb_ckpt_safetensors_save_sharded(ctx, pos[2], NULL, t, NULL, co.shard, &so)
                         : nb_ckpt_safetensors_save(ctx, pos[2], t, NULL, &so);
  size_t n = nb_tree_size(t);
  nb_tree_destroy(t);
  if (s != NB_OK) return fail(ctx, "export");
  printf("wrote %zu tensors to %s\n", n, pos[2]);
  nb_ctx_destroy(ctx);
  return 0;
}

static int cmd_import(int argc, char **argv) {
  const char *pos[2];
  conv_opts co = {.item = "params"};
  int pc = parse_conv(argc, argv, 2, pos, &co);
  if (pc == -2) return 2;
  if (pc != 0 || !co.has_step) return usage();
  /* the checkpoint directory is written as a whole (new steps, retention): not over its input */
  if (!nb_cli_output_ok("ckpt import", pos[1], true, 1, pos)) return 2;
  nb_ctx *ctx = nb_ctx_create();
  nb_ckpt_st_opts so = {.hf_names = co.hf};
  char *meta = NULL;
  nb_tree *t = nb_ckpt_safetensors_load(ctx, pos[0], &so, &meta);
  if (!t) return fail(ctx, "import");
  nb_ckpt_options o = {.directory = pos[1]};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_ckpt_item it = {co.item, t};
  nb_ckpt_save_opts sv = {.metadata_json = meta, .force = true};
  nb_status s = m ? nb_ckpt_save(m, co.step, &it, 1, &sv, NULL) : nb_ctx_status(ctx);
  size_t n = nb_tree_size(t);
  nb_ckpt_manager_destroy(m);
  nb_ckpt_string_free(ctx, meta);
  nb_tree_destroy(t);
  if (s != NB_OK) return fail(ctx, "import");
  printf("saved %zu tensors as step %lld, item '%s', in %s\n", n, (long long)co.step, co.item, pos[1]);
  if (!strcmp(co.item, "params")) /* such a checkpoint is weights, not a run to resume */
    printf("to train from these weights: nabla train CONFIG init_from=%s (in a new run dir)\n", pos[1]);
  nb_ctx_destroy(ctx);
  return 0;
}

int nb_cmd_ckpt(int argc, char **argv) {
  help_asked = nb_cli_help_asked(argc, argv);
  if (argc < 2 || help_asked) return usage();
  const char *sub = argv[1];
  argc -= 2, argv += 2;
  if (!strcmp(sub, "list")) return cmd_list(argc, argv);
  if (!strcmp(sub, "show")) return cmd_show(argc, argv);
  if (!strcmp(sub, "verify")) return cmd_verify(argc, argv);
  if (!strcmp(sub, "export")) return cmd_export(argc, argv);
  if (!strcmp(sub, "import")) return cmd_import(argc, argv);
  fprintf(stderr, "nabla ckpt: unknown subcommand '%s'\n", sub);
  return usage();
}
