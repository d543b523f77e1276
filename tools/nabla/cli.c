/* Helpers every `nabla` command uses (cli.h). */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nabla/nabla.h"

bool nb_cli_help_asked(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) /* after "--": another command's arguments */
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
  return false;
}

int nb_cli_usage(const char *text, bool asked) {
  fputs(text, asked ? stdout : stderr);
  return asked ? 0 : 2;
}

bool nb_cli_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char why[160];
  if (!v) return fprintf(stderr, "nabla %s: %s needs a value\n", cmd, flag), false;
  if (!nb_parse_int(v, lo, hi, out, why, sizeof why)) return fprintf(stderr, "nabla %s: %s: %s\n", cmd, flag, why), false;
  return true;
}

bool nb_cli_float(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
  char why[160];
  if (!v) return fprintf(stderr, "nabla %s: %s needs a value\n", cmd, flag), false;
  if (!nb_parse_float(v, lo, hi, out, why, sizeof why)) return fprintf(stderr, "nabla %s: %s: %s\n", cmd, flag, why), false;
  return true;
}

char *nb_cli_read_input(const char *cmd, const char *path, size_t *n) {
  bool std_in = !path || !strcmp(path, "-");
  FILE *f = std_in ? stdin : fopen(path, "rb");
  struct stat st;
  if (!f) return fprintf(stderr, "nabla %s: cannot open %s: %s\n", cmd, path, strerror(errno)), NULL;
  if (!std_in && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    fprintf(stderr, "nabla %s: %s is a directory (give the files in it)\n", cmd, path);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap + 1);
  while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
    if ((len += got) == cap) {
      char *b = realloc(buf, (cap *= 2) + 1);
      if (!b) free(buf);
      buf = b;
    }
  bool bad = ferror(f);
  if (!std_in) fclose(f);
  if (!buf || bad) {
    free(buf);
    fprintf(stderr, "nabla %s: reading %s: %s\n", cmd, std_in ? "stdin" : path, buf ? "read error" : "out of memory");
    return NULL;
  }
  buf[len] = 0;
  *n = len;
  return buf;
}

/* path resolved (symlinks, ".", ".."), also when its last components do not
 * exist yet: the nearest existing ancestor resolved, the rest appended. */
static bool resolve(const char *path, char out[PATH_MAX]) {
  char head[PATH_MAX], tail[PATH_MAX] = "";
  if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head) return false;
  for (;;) {
    if (realpath(*head ? head : ".", out)) break;
    if (!*head) return false; /* not even the working directory resolves */
    char *slash = strrchr(head, '/');
    const char *last = slash ? slash + 1 : head;
    char t[PATH_MAX];
    if (snprintf(t, sizeof t, "%s%s%s", last, *tail ? "/" : "", tail) >= (int)sizeof t) return false;
    memcpy(tail, t, sizeof t);
    if (!slash) head[0] = 0;
    else if (slash == head) head[1] = 0; /* "/x": the root */
    else *slash = 0;
  }
  /* append the missing components, folding "." and ".." by name */
  for (char *c = strtok(tail, "/"); c; c = strtok(NULL, "/")) {
    if (!strcmp(c, ".")) continue;
    size_t n = strlen(out);
    if (!strcmp(c, "..")) {
      char *s = strrchr(out, '/');
      if (s) s == out ? (void)(out[1] = 0) : (void)(*s = 0);
      continue;
    }
    if (n + 1 + strlen(c) >= PATH_MAX) return false;
    snprintf(out + n, PATH_MAX - n, "%s%s", out[n - 1] == '/' ? "" : "/", c);
  }
  return true;
}

/* a is b or lies below it (paths resolved) */
static bool within(const char *a, const char *b) {
  size_t n = strlen(b);
  if (n == 1 && b[0] == '/') return true;
  return !strncmp(a, b, n) && (a[n] == 0 || a[n] == '/');
}

bool nb_cli_output_ok(const char *cmd, const char *out, bool out_is_dir, int n_in, const char *const *inputs) {
  char ro[PATH_MAX], ri[PATH_MAX];
  struct stat so, si;
  if (!resolve(out, ro)) return fprintf(stderr, "nabla %s: output path %s is too long\n", cmd, out), false;
  bool out_exists = stat(out, &so) == 0;
  for (int i = 0; i < n_in; i++) {
    if (!inputs[i] || !strcmp(inputs[i], "-") || stat(inputs[i], &si) != 0 || !realpath(inputs[i], ri)) continue;
    bool same = out_exists && so.st_dev == si.st_dev && so.st_ino == si.st_ino;
    if (same || within(ro, ri)) {
      fprintf(stderr, "nabla %s: the output %s %s the input %s: refusing to overwrite an input\n", cmd, out,
              same || !strcmp(ro, ri) ? "is" : "is inside", inputs[i]);
      return false;
    }
    if (out_is_dir && within(ri, ro)) {
      fprintf(stderr, "nabla %s: the input %s is inside the output directory %s: refusing to write over it\n", cmd,
              inputs[i], out);
      return false;
    }
  }
  return true;
}

bool nb_cli_is_gguf(const char *path) {
  struct stat st;
  char magic[4] = {0};
  FILE *f = !stat(path, &st) && S_ISREG(st.st_mode) ? fopen(path, "rb") : NULL;
  bool yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
  if (f) fclose(f);
  return yes;
}

int nb_cli_load_model(nb_ctx *ctx, const char *model, const char *config, nb_model_loaded *out) {
  char p[4200];
  struct stat st;
  if (nb_cli_is_gguf(model)) {
    if (config) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "--config goes with a run dir or checkpoint, not a GGUF file");
    int64_t nq;
    nb_status s = nb_model_load_gguf(ctx, model, out);
    if (!s && (s = nb_cli_gguf_keep_quantized(ctx, model, out, NB_QUANT_ACT_INT8_BLOCK, &nq))) nb_model_loaded_free(out);
    return s;
  }
  snprintf(p, sizeof p, "%s/config.yaml", model);
  if (!stat(p, &st) && S_ISREG(st.st_mode)) return nb_train_load_run_dir(ctx, model, config, out);
  snprintf(p, sizeof p, "%s/config.json", model);
  if (!config && !stat(p, &st) && S_ISREG(st.st_mode)) return nb_model_load_hf(ctx, model, out);
  return nb_train_load_checkpoint(ctx, model, config, out);
}

int nb_cli_text_ids(nb_ctx *ctx, const char *path, const nb_model_loaded *m, int32_t **ids, size_t *n) {
  *ids = NULL, *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, NB_ERR_IO, "%s: cannot open", path);
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      char *t = realloc(text, cap = cap ? 2 * cap : 1 << 16);
      if (!t) return free(text), fclose(f), nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", path);
      text = t;
    }
    size_t got = fread(text + len, 1, cap - len, f);
    if (!got) break;
    len += got;
  }
  bool err = ferror(f);
  fclose(f);
  if (err) return free(text), nb_errorf(ctx, NB_ERR_IO, "%s: read error", path);
  nb_status s = NB_OK;
  if (m->tok) {
    nb_tok_ids enc = {0};
    s = nb_tok_encode(m->tok, text, len, &(nb_tok_encode_opts){.special = NB_TOK_SPECIAL_AS_TEXT}, &enc);
    if (!s && !(*ids = malloc(sizeof **ids * (enc.len + 1)))) s = nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", path);
    if (!s) memcpy(*ids, enc.ids, sizeof **ids * enc.len), *n = enc.len;
    nb_tok_ids_free(m->tok, &enc);
  } else if (!(*ids = malloc(sizeof **ids * (len + 1)))) {
    s = nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", path);
  } else {
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = len;
  }
  free(text);
  return s;
}

bool nb_cli_quant_hook(const char *cmd, nb_ctx *ctx, const nb_tree *params, nb_serve_model_opts *mo, nb_quant_plan **plan) {
  *plan = NULL;
  int64_t n = nb_quant_tree_count(ctx, params);
  if (n < 0) return fprintf(stderr, "nabla %s: %s\n", cmd, nb_ctx_error(ctx)), false;
  if (n == 0) return true;
  *plan = nb_quant_plan_create(ctx, params);
  if (!*plan) return fprintf(stderr, "nabla %s: %s\n", cmd, nb_ctx_error(ctx)), false;
  mo->linear_hook = nb_quant_linear_hook, mo->hook_ud = *plan;
  return true;
}
