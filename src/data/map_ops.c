/* Map datasets: the node life cycle and the random-access transforms
 * (shuffle by a Feistel permutation, slice, shard, repeat, map, random_map,
 * filter, batch, mix, tokenize). Every get(i) is a pure function of i, so
 * any thread may call it in any order. Not here: sources (map_sources.c). */
#include <string.h>

#include "data/internal.h"

nb_data_map *nb_data__map_new(nb_ctx *ctx, const nb_data__map_ops *ops, nb_data_map *parent, int64_t len,
                              size_t impl_size) {
  nb_data_map *ds = nb_calloc(ctx, sizeof *ds);
  void *impl = ds ? nb_calloc(ctx, impl_size ? impl_size : 1) : NULL;
  if (!impl) {
    nb_dealloc(ctx, ds, sizeof *ds);
    nb_data_map_release(parent);
    return NULL;
  }
  ds->ctx = ctx;
  ds->ops = ops;
  atomic_init(&ds->refs, 1);
  ds->len = len < 0 ? 0 : len;
  ds->parent = parent;
  ds->impl = impl;
  ds->impl_size = impl_size ? impl_size : 1;
  return ds;
}

int64_t nb_data_map_len(const nb_data_map *ds) { return ds ? ds->len : 0; }
void nb_data_map_retain(nb_data_map *ds) { atomic_fetch_add(&ds->refs, 1); }

void nb_data_map_release(nb_data_map *ds) {
  if (!ds || atomic_fetch_sub(&ds->refs, 1) != 1) return;
  if (ds->ops->destroy) ds->ops->destroy(ds);
  nb_dealloc(ds->ctx, ds->impl, ds->impl_size);
  nb_data_map_release(ds->parent);
  nb_dealloc(ds->ctx, ds, sizeof *ds);
}

nb_status nb_data_map_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  nb_data_elem_clear(ds->ctx, out);
  if (i < 0) return nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "%s dataset: negative index %lld", ds->ops->name, (long long)i);
  if (ds->len == 0) return nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "%s dataset is empty: no element %lld",
                                        ds->ops->name, (long long)i);
  return ds->ops->get(ds, i, out);
}

/* ---- permutation ---------------------------------------------------------- */

uint64_t nb_data__permute(uint64_t i, uint64_t n, uint64_t key) {
  if (n <= 1) return i;
  int bits = 64 - __builtin_clzll(n - 1);
  if (bits & 1) bits++;
  int half = bits / 2;
  uint64_t mask = (1ull << half) - 1, x = i;
  do { /* a balanced Feistel network on [0, 4^half), walked until back in [0, n) */
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 6; round++) {
      uint64_t f = nb_data__mix64(r ^ key ^ (round * 0x9e3779b97f4a7c15ull)) & mask;
      uint64_t t = l ^ f;
      l = r;
      r = t;
    }
    x = (l << half) | r;
  } while (x >= n);
  return x;
}

/* ---- shuffle -------------------------------------------------------------- */

typedef struct shuffle_impl {
  uint64_t seed;
} shuffle_impl;

static nb_status shuffle_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const shuffle_impl *s = ds->impl;
  int64_t n = ds->parent->len, epoch = i / n;
  uint64_t key = nb_data__mix64(s->seed ^ nb_data__mix64((uint64_t)epoch + 1));
  int64_t j = (int64_t)nb_data__permute((uint64_t)(i % n), (uint64_t)n, key);
  return nb_data_map_get(ds->parent, epoch * n + j, out);
}

static const nb_data__map_ops shuffle_ops = {"shuffle", shuffle_get, NULL};

nb_data_map *nb_data_map_shuffle(nb_data_map *ds, uint64_t seed) {
  if (!ds) return NULL;
  nb_data_map *m = nb_data__map_new(ds->ctx, &shuffle_ops, ds, ds->len, sizeof(shuffle_impl));
  if (m) ((shuffle_impl *)m->impl)->seed = seed;
  return m;
}

/* ---- slice, shard, repeat --------------------------------------------------- */

typedef struct slice_impl {
  int64_t start, step;
} slice_impl;

static nb_status slice_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const slice_impl *s = ds->impl;
  int64_t epoch = i / ds->len, j = i % ds->len;
  return nb_data_map_get(ds->parent, epoch * ds->parent->len + s->start + j * s->step, out);
}

static const nb_data__map_ops slice_ops = {"slice", slice_get, NULL};

nb_data_map *nb_data_map_slice(nb_data_map *ds, int64_t start, int64_t stop, int64_t step) {
  if (!ds) return NULL;
  if (step < 1) {
    nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "slice: step %lld must be >= 1", (long long)step);
    return nb_data_map_release(ds), NULL;
  }
  int64_t n = ds->len;
  start = start < 0 ? 0 : start > n ? n : start;
  stop = stop < start ? start : stop > n ? n : stop;
  /* ceil((stop - start) / step) without the + step - 1 that overflows on an endless (INT64_MAX) map */
  int64_t len = (stop - start) / step + ((stop - start) % step != 0);
  nb_data_map *m = nb_data__map_new(ds->ctx, &slice_ops, ds, len, sizeof(slice_impl));
  if (m) *(slice_impl *)m->impl = (slice_impl){start, step};
  return m;
}

nb_data_map *nb_data_map_shard(nb_data_map *ds, int64_t index, int64_t count, bool drop_remainder) {
  if (!ds) return NULL;
  if (count < 1 || index < 0 || index >= count) {
    nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "shard: process index %lld not in [0, %lld)", (long long)index,
                 (long long)count);
    return nb_data_map_release(ds), NULL;
  }
  __int128 n = ds->len;
  int64_t start, stop;
  if (drop_remainder) {
    int64_t per = (int64_t)(n / count);
    start = index * per;
    stop = start + per;
  } else {
    start = (int64_t)(n * index / count);
    stop = (int64_t)(n * (index + 1) / count);
  }
  return nb_data_map_slice(ds, start, stop, 1);
}

static nb_status repeat_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  return nb_data_map_get(ds->parent, i, out); /* the parent wraps into its next epoch */
}

static const nb_data__map_ops repeat_ops = {"repeat", repeat_get, NULL};

nb_data_map *nb_data_map_repeat(nb_data_map *ds, int64_t epochs) {
  if (!ds) return NULL;
  int64_t n = ds->len, len = n;
  if (n > 0) len = epochs <= 0 || epochs > INT64_MAX / n ? INT64_MAX : n * epochs;
  return nb_data__map_new(ds->ctx, &repeat_ops, ds, len, 1);
}

/* ---- map, random_map, filter, tokenize ------------------------------------ */

typedef struct fn_impl {
  nb_data_map_fn map;
  nb_data_random_map_fn random_map;
  nb_data_filter_fn filter;
  void *ud;
  uint64_t seed;
  nb_data_tokenizer tok;
} fn_impl;

static nb_status fn_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const fn_impl *f = ds->impl;
  nb_status s = nb_data_map_get(ds->parent, i, out);
  if (s || out->kind == NB_DATA_NONE) return s;
  if (f->map) return f->map(f->ud, ds->ctx, out);
  if (f->random_map) {
    nb_data_rng rng = nb_data_rng_make(f->seed, (uint64_t)i);
    return f->random_map(f->ud, ds->ctx, &rng, out);
  }
  if (f->filter) {
    bool keep = true;
    s = f->filter(f->ud, ds->ctx, out, &keep);
    if (!s && !keep) nb_data_elem_clear(ds->ctx, out);
    return s;
  }
  if (out->kind != NB_DATA_BYTES)
    return nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "tokenize: element %lld is not bytes", (long long)i);
  nb_data_elem text = *out;
  *out = (nb_data_elem)NB_DATA_ELEM_INIT;
  s = nb_data__tokenize(ds->ctx, &f->tok, (const char *)text.bytes, text.len, out);
  nb_data_elem_clear(ds->ctx, &text);
  return s;
}

static const nb_data__map_ops map_ops = {"map", fn_get, NULL}, random_map_ops = {"random_map", fn_get, NULL},
                              filter_ops = {"filter", fn_get, NULL}, tokenize_ops = {"tokenize", fn_get, NULL};

static nb_data_map *fn_node(nb_data_map *ds, const nb_data__map_ops *ops, fn_impl f, bool have_fn) {
  if (!ds) return NULL;
  if (!have_fn) {
    nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "%s: the function is NULL", ops->name);
    return nb_data_map_release(ds), NULL;
  }
  nb_data_map *m = nb_data__map_new(ds->ctx, ops, ds, ds->len, sizeof(fn_impl));
  if (m) *(fn_impl *)m->impl = f;
  return m;
}

nb_data_map *nb_data_map_map(nb_data_map *ds, nb_data_map_fn fn, void *ud) {
  return fn_node(ds, &map_ops, (fn_impl){.map = fn, .ud = ud}, fn != NULL);
}

nb_data_map *nb_data_map_random_map(nb_data_map *ds, nb_data_random_map_fn fn, void *ud, uint64_t seed) {
  return fn_node(ds, &random_map_ops, (fn_impl){.random_map = fn, .ud = ud, .seed = seed}, fn != NULL);
}

nb_data_map *nb_data_map_filter(nb_data_map *ds, nb_data_filter_fn fn, void *ud) {
  return fn_node(ds, &filter_ops, (fn_impl){.filter = fn, .ud = ud}, fn != NULL);
}

nb_data_map *nb_data_map_tokenize(nb_data_map *ds, const nb_data_tokenizer *tok) {
  nb_data_tokenizer t = tok ? *tok : nb_data_tokenizer_bytes();
  return fn_node(ds, &tokenize_ops, (fn_impl){.tok = t}, t.encode != NULL);
}

/* ---- batch -------------------------------------------------------------- */

typedef struct batch_impl {
  int64_t size;
} batch_impl;

static nb_status batch_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  int64_t size = ((const batch_impl *)ds->impl)->size, n = ds->parent->len;
  int64_t epoch = i / ds->len, start = (i % ds->len) * size, count = n - start < size ? n - start : size;
  nb_ctx *ctx = ds->ctx;
  nb_data_elem *elems = nb_calloc(ctx, (size_t)count * sizeof *elems);
  if (!elems) return nb_data__err(ctx, NB_ERR_NOMEM, "batch: out of memory");
  nb_status s = NB_OK;
  for (int64_t k = 0; !s && k < count; k++) {
    s = nb_data_map_get(ds->parent, epoch * n + start + k, &elems[k]);
    if (!s && elems[k].kind == NB_DATA_NONE)
      s = nb_data__err(ctx, NB_ERR_INVALID_ARG, "batch: element %lld was filtered out; a map dataset cannot batch "
                       "over holes (filter and batch in the iterator stage instead)", (long long)(start + k));
  }
  if (!s) s = nb_data__stack(ctx, elems, count, NULL, "batch", out);
  for (int64_t k = 0; k < count; k++) nb_data_elem_clear(ctx, &elems[k]);
  nb_dealloc(ctx, elems, (size_t)count * sizeof *elems);
  return s;
}

static const nb_data__map_ops batch_ops = {"batch", batch_get, NULL};

nb_data_map *nb_data_map_batch(nb_data_map *ds, int64_t size, bool drop_remainder) {
  if (!ds) return NULL;
  if (size < 1) {
    nb_data__err(ds->ctx, NB_ERR_INVALID_ARG, "batch: size %lld must be >= 1", (long long)size);
    return nb_data_map_release(ds), NULL;
  }
  int64_t n = ds->len, len = drop_remainder ? n / size : n / size + (n % size != 0);
  nb_data_map *m = nb_data__map_new(ds->ctx, &batch_ops, ds, len, sizeof(batch_impl));
  if (m) ((batch_impl *)m->impl)->size = size;
  return m;
}

/* ---- mix ------------------------------------------------------------------ */

#define MIX_SCALE 10000

typedef struct mix_impl {
  int n;
  nb_data_map **dss;  /* owned references */
  int64_t period;     /* sum of w */
  int64_t *w;         /* integer weights per dataset */
  uint8_t *which;     /* [period]: the dataset at each position of a period */
  int64_t *rank;      /* [period]: its index among that dataset's positions */
  int64_t *pos;       /* [period]: positions of dataset k's occurrences, k-major */
  int64_t *pos_start; /* [n] */
} mix_impl;

static nb_status mix_get(nb_data_map *ds, int64_t i, nb_data_elem *out) {
  const mix_impl *m = ds->impl;
  int64_t per = i / m->period, r = i % m->period;
  int k = m->which[r];
  return nb_data_map_get(m->dss[k], per * m->w[k] + m->rank[r], out);
}

static void mix_destroy(nb_data_map *ds) {
  mix_impl *m = ds->impl;
  nb_ctx *ctx = ds->ctx;
  for (int k = 0; k < m->n; k++) nb_data_map_release(m->dss ? m->dss[k] : NULL);
  nb_dealloc(ctx, m->dss, (size_t)m->n * sizeof *m->dss);
  nb_dealloc(ctx, m->w, (size_t)m->n * sizeof *m->w);
  nb_dealloc(ctx, m->pos_start, (size_t)m->n * sizeof *m->pos_start);
  size_t p = (size_t)m->period;
  nb_dealloc(ctx, m->which, p);
  nb_dealloc(ctx, m->rank, p * sizeof *m->rank);
  nb_dealloc(ctx, m->pos, p * sizeof *m->pos);
}

static const nb_data__map_ops mix_ops = {"mix", mix_get, mix_destroy};

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Integer weights summing to MIX_SCALE (largest remainder, each >= 1), then
 * divided by their gcd. */
static void integer_weights(int n, const double *weights, int64_t *w) {
  double sum = 0;
  for (int k = 0; k < n; k++) sum += weights[k];
  int64_t total = 0;
  for (int k = 0; k < n; k++) {
    w[k] = (int64_t)(weights[k] / sum * MIX_SCALE);
    if (w[k] < 1) w[k] = 1;
    total += w[k];
  }
  while (total != MIX_SCALE) { /* give to the largest shortfall, or take from the largest excess */
    bool up = total < MIX_SCALE;
    int best = -1;
    double bd = 0;
    for (int k = 0; k < n; k++) {
      if (!up && w[k] <= 1) continue;
      double d = weights[k] / sum * MIX_SCALE - (double)w[k];
      if (!up) d = -d;
      if (best < 0 || d > bd) best = k, bd = d;
    }
    w[best] += up ? 1 : -1;
    total += up ? 1 : -1;
  }
  int64_t g = 0;
  for (int k = 0; k < n; k++) g = gcd64(g, w[k]);
  for (int k = 0; k < n; k++) w[k] /= g;
}

/* The interleaving of one period: smooth weighted round robin. */
static void build_period(mix_impl *m) {
  int64_t credit[256] = {0}, seen[256] = {0};
  for (int k = 0; k < m->n; k++) m->pos_start[k] = k ? m->pos_start[k - 1] + m->w[k - 1] : 0;
  for (int64_t p = 0; p < m->period; p++) {
    int best = 0;
    for (int k = 0; k < m->n; k++) {
      credit[k] += m->w[k];
      if (credit[k] > credit[best]) best = k;
    }
    credit[best] -= m->period;
    m->which[p] = (uint8_t)best;
    m->rank[p] = seen[best];
    m->pos[m->pos_start[best] + seen[best]++] = p;
  }
}

/* The first position at which dataset k would need element len_k. */
static int64_t mix_end(const mix_impl *m, int k, int64_t len_k) {
  int64_t per = len_k / m->w[k], within = len_k % m->w[k];
  if (per > (INT64_MAX - m->period) / m->period) return INT64_MAX;
  return per * m->period + m->pos[m->pos_start[k] + within];
}

nb_data_map *nb_data_map_mix(nb_ctx *ctx, int n, nb_data_map **dss, const double *weights) {
  bool bad = n < 1 || n > 256 || !dss || !weights;
  for (int k = 0; !bad && k < n; k++) bad = !dss[k] || !(weights[k] > 0);
  if (bad) {
    if (n >= 1 && n <= 256 && dss && weights) {
      for (int k = 0; k < n; k++)
        if (dss[k] && !(weights[k] > 0))
          nb_data__err(ctx, NB_ERR_INVALID_ARG, "mix: weight %d is %g; weights must be > 0", k, weights[k]);
    } else {
      nb_data__err(ctx, NB_ERR_INVALID_ARG, "mix: need 1..256 datasets and their weights (got %d)", n);
    }
    for (int k = 0; dss && k < n; k++) nb_data_map_release(dss[k]);
    return NULL;
  }
  nb_data_map *ds = nb_data__map_new(ctx, &mix_ops, NULL, 0, sizeof(mix_impl));
  if (!ds) {
    for (int k = 0; k < n; k++) nb_data_map_release(dss[k]);
    return NULL;
  }
  mix_impl *m = ds->impl;
  m->n = n;
  m->dss = nb_alloc(ctx, (size_t)n * sizeof *m->dss);
  m->w = nb_alloc(ctx, (size_t)n * sizeof *m->w);
  m->pos_start = nb_alloc(ctx, (size_t)n * sizeof *m->pos_start);
  if (m->dss) memcpy(m->dss, dss, (size_t)n * sizeof *dss);
  else for (int k = 0; k < n; k++) nb_data_map_release(dss[k]);
  if (!m->dss || !m->w || !m->pos_start) return nb_data_map_release(ds), NULL;
  integer_weights(n, weights, m->w);
  for (int k = 0; k < n; k++) m->period += m->w[k];
  size_t p = (size_t)m->period;
  m->which = nb_alloc(ctx, p);
  m->rank = nb_alloc(ctx, p * sizeof *m->rank);
  m->pos = nb_alloc(ctx, p * sizeof *m->pos);
  if (!m->which || !m->rank || !m->pos) return nb_data_map_release(ds), NULL;
  build_period(m);
  ds->len = INT64_MAX;
  for (int k = 0; k < n; k++) {
    int64_t e = mix_end(m, k, dss[k]->len);
    if (e < ds->len) ds->len = e;
  }
  return ds;
}
