/* GRPO's rewards: a weighted set of built-ins (exact answer after a PCRE2
 * pattern, a format pattern, a length term) and caller callbacks, each
 * scoring one completion with its prompt and the data row's fields. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nabla/posttrain.h"

static const char *const kind_names[NB_PT_REWARD_KIND_COUNT] = {"exact", "format", "length"};

const char *nb_pt_reward_kind_name(nb_pt_reward_kind k) {
  return (int)k >= 0 && k < NB_PT_REWARD_KIND_COUNT ? kind_names[k] : NULL;
}

const char *nb_pt_reward_field(const nb_pt_reward_in *in, const char *key) {
  for (int i = 0; in && key && i < in->n_fields; i++)
    if (!strcmp(in->keys[i], key)) return in->values[i];
  return NULL;
}

typedef struct reward {
  char name[64];
  double weight;
  nb_pt_reward_fn fn;            /* a callback, or NULL: the built-in spec */
  void *ud;
  nb_pt_reward_spec spec;
  pcre2_code *re;                /* exact (may be NULL: the whole completion) and format */
  pcre2_match_data *md;
} reward;

struct nb_pt_rewards {
  nb_ctx *ctx;
  int n;
  reward r[NB_PT_REWARD_MAX + 8];
};

static pcre2_code *compile(nb_ctx *ctx, const char *where, int i, const char *pattern) {
  int err;
  PCRE2_SIZE off;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
  if (!re) {
    char msg[160];
    pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].pattern: '%s': %s at offset %zu", where, i, pattern, msg, (size_t)off);
  }
  return re;
}

nb_pt_rewards *nb_pt_rewards_create(nb_ctx *ctx, const nb_pt_reward_spec *specs, int n, const char *where) {
  if (!where) where = "rewards";
  if (n < 0 || n > NB_PT_REWARD_MAX || (n && !specs))
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: %d rewards (at most %d)", where, n, NB_PT_REWARD_MAX), NULL;
  nb_pt_rewards *rs = calloc(1, sizeof *rs);
  if (!rs) return nb_errorf(ctx, NB_ERR_NOMEM, "%s: out of memory", where), NULL;
  rs->ctx = ctx;
  for (int i = 0; i < n; i++) {
    const nb_pt_reward_spec *s = &specs[i];
    reward *r = &rs->r[rs->n++];
    r->spec = *s;
    r->weight = s->weight;
    if ((int)s->kind < 0 || s->kind >= NB_PT_REWARD_KIND_COUNT) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].kind: %d is not one of exact, format, length", where, i, s->kind);
      goto fail;
    }
    int same = 0; /* "exact", then "exact_1", ... for a second of a kind */
    for (int k = 0; k < i; k++) same += specs[k].kind == s->kind;
    if (same) snprintf(r->name, sizeof r->name, "%s_%d", kind_names[s->kind], same);
    else snprintf(r->name, sizeof r->name, "%s", kind_names[s->kind]);
    if (!isfinite(s->weight)) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].weight: %g is not a finite number", where, i, s->weight);
      goto fail;
    }
    if (s->kind == NB_PT_REWARD_FORMAT && !s->pattern[0]) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d].pattern: a format reward needs a pattern", where, i);
      goto fail;
    }
    if (s->kind == NB_PT_REWARD_LENGTH && !(isfinite(s->scale) && isfinite(s->target) && s->target >= 0)) {
      nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s[%d]: a length reward needs a finite scale and a target >= 0", where, i);
      goto fail;
    }
    if (s->kind != NB_PT_REWARD_LENGTH && s->pattern[0]) {
      if (!(r->re = compile(ctx, where, i, s->pattern)) || !(r->md = pcre2_match_data_create_from_pattern(r->re, NULL)))
        goto fail;
    }
  }
  return rs;
fail:
  nb_pt_rewards_destroy(rs);
  return NULL;
}

nb_status nb_pt_rewards_add(nb_pt_rewards *rs, const char *name, nb_pt_reward_fn fn, void *ud, double weight) {
  if (!rs) return NB_ERR_INVALID_ARG;
  if (!fn || !name || !name[0] || strlen(name) >= sizeof rs->r[0].name || !isfinite(weight))
    return nb_errorf(rs->ctx, NB_ERR_INVALID_ARG, "rewards: a callback needs a name (< 64 bytes), a function and a finite weight");
  if (rs->n >= (int)(sizeof rs->r / sizeof *rs->r))
    return nb_errorf(rs->ctx, NB_ERR_INVALID_ARG, "rewards: at most %d rewards", (int)(sizeof rs->r / sizeof *rs->r));
  for (int i = 0; i < rs->n; i++)
    if (!strcmp(rs->r[i].name, name)) return nb_errorf(rs->ctx, NB_ERR_INVALID_ARG, "rewards: '%s' is already a reward", name);
  reward *r = &rs->r[rs->n++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->fn = fn, r->ud = ud, r->weight = weight;
  return NB_OK;
}

void nb_pt_rewards_destroy(nb_pt_rewards *rs) {
  if (!rs) return;
  for (int i = 0; i < rs->n; i++) {
    pcre2_match_data_free(rs->r[i].md);
    pcre2_code_free(rs->r[i].re);
  }
  free(rs);
}

int nb_pt_rewards_count(const nb_pt_rewards *rs) { return rs ? rs->n : 0; }
const char *nb_pt_rewards_name(const nb_pt_rewards *rs, int i) { return rs && i >= 0 && i < rs->n ? rs->r[i].name : NULL; }

/* [*b, *e) without white space at either end */
static void trim(const char **b, const char **e) {
  while (*b < *e && isspace((unsigned char)**b)) (*b)++;
  while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

static double exact(reward *r, const nb_pt_reward_in *in) {
  const char *want = nb_pt_reward_field(in, r->spec.field[0] ? r->spec.field : "answer");
  if (!want) return NAN; /* no answer in this row: no score */
  const char *b = in->completion, *e = b + strlen(b);
  if (r->re) {
    int rc = pcre2_match(r->re, (PCRE2_SPTR)b, (PCRE2_SIZE)(e - b), 0, 0, r->md, NULL);
    if (rc < 0) return 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
    int grp = rc > 1 && ov[2] != PCRE2_UNSET ? 1 : 0;
    e = b + ov[2 * grp + 1];
    b = b + ov[2 * grp];
  }
  const char *wb = want, *we = want + strlen(want);
  trim(&b, &e);
  trim(&wb, &we);
  return e - b == we - wb && !memcmp(b, wb, (size_t)(e - b)) ? 1 : 0;
}

static double builtin(reward *r, const nb_pt_reward_in *in) {
  switch (r->spec.kind) {
  case NB_PT_REWARD_EXACT: return exact(r, in);
  case NB_PT_REWARD_FORMAT:
    return pcre2_match(r->re, (PCRE2_SPTR)in->completion, strlen(in->completion), 0, 0, r->md, NULL) >= 0 ? 1 : 0;
  default: return -r->spec.scale * fabs((double)in->n_completion - r->spec.target);
  }
}

double nb_pt_rewards_score(nb_pt_rewards *rs, const nb_pt_reward_in *in, double *per) {
  double total = 0;
  int scored = 0;
  for (int i = 0; rs && i < rs->n; i++) {
    reward *r = &rs->r[i];
    double v = r->fn ? r->fn(r->ud, in) : builtin(r, in);
    if (per) per[i] = v;
    if (!isnan(v)) total += r->weight * v, scored++;
  }
  return scored ? total : NAN;
}

nb_status nb_pt__rewards_share(nb_pt_rewards *dst, const nb_pt_rewards *src, int i) {
  if (!dst || !src || i < 0 || i >= src->n) return NB_ERR_INVALID_ARG;
  const reward *r = &src->r[i];
  if (!r->fn)
    return nb_errorf(dst->ctx, NB_ERR_INVALID_ARG, "rewards: '%s' is a built-in: give built-ins in the config, callbacks here", r->name);
  return nb_pt_rewards_add(dst, r->name, r->fn, r->ud, r->weight);
}
