/* CPU backend: dot_general through nabla's own f32 product (sgemm.c) and
 * OpenBLAS's cblas_dgemm.
 * Any layout of floating operands: each operand is a batch of matrices
 * (its free dims x its contracting dims, each group merged into one strided
 * axis when memory allows). When one of the two axes has unit stride the
 * buffer goes to BLAS as it is, the transposes becoming the call's flags and
 * leading dims, the batch dims any strides; otherwise (free dims split by a
 * batch dim) or when BLAS has no routine for the dtype (f16, bf16) the
 * operand is packed once into a contiguous f32/f64 scratch, converting as
 * it goes. A result of another dtype is computed in f32/f64 and converted.
 * Every product is cut into tiles by its shape alone, run on the thread
 * pool with OpenBLAS on one thread inside each (set process-wide), so that
 * results do not depend on the thread count (OpenBLAS's own threads are
 * never used). Which OpenBLAS kernels, and its idle threads: nb_jit_blas_core. Not here: integer dots (the reference
 * implementation), epilogues (fused kernels after the step). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/sgemm.h"
#include "backend/dot_layout.h"
#ifdef NABLA_HAVE_CBLAS
#include <cblas.h>
#endif

#define TASKS_PER_THREAD 4 /* more packing tasks than threads even out a core that other work slows */
#define PACK_TASK_ELEMS 32768 /* elements per packing task below which splitting does not pay */

#ifdef NABLA_HAVE_CBLAS

/* OpenBLAS's kernels for this CPU. A DYNAMIC_ARCH OpenBLAS picks its kernels
 * from the CPU model at load time, and a build older than the CPU falls back
 * far: Debian 12's 0.3.21 on an Emerald Rapids Xeon (family 6, model 0xCF)
 * picks "Prescott" (SSE3), whose sgemm runs at a fifth of the AVX-512 one
 * (29 vs 150 GFLOP/s on one core of the CI machine). When the kernels OpenBLAS
 * picked use less of the vector ISA than the CPU has, and neither
 * OPENBLAS_CORETYPE nor NABLA_BLAS_CORETYPE=keep says otherwise, we re-run
 * OpenBLAS's own selection with OPENBLAS_CORETYPE set to the best core it
 * has for the CPU's ISA. That entry point (gotoblas_dynamic_init) is only in
 * DYNAMIC_ARCH builds, hence the weak references. Done once, before our first
 * BLAS call. */
char *openblas_get_corename(void);
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
void openblas_read_env(void) __attribute__((weak));
void blas_thread_shutdown_(void) __attribute__((weak));

/* Vector ISA level of an OpenBLAS 0.3.x x86-64 core name; -1 when unknown
 * (a newer name: trust OpenBLAS). */
static int core_level(const char *name) {
  static const struct { const char *name; int level; } cores[] = {
      {"prescott", 0},   {"core2", 0},      {"penryn", 0},    {"dunnington", 0}, {"nehalem", 0},
      {"atom", 0},       {"nano", 0},       {"opteron", 0},   {"barcelona", 0},  {"bobcat", 0},
      {"katmai", 0},     {"coppermine", 0}, {"northwood", 0}, {"banias", 0},     {"athlon", 0},
      {"sandybridge", 1}, {"bulldozer", 1}, {"piledriver", 1}, {"steamroller", 2}, {"excavator", 2},
      {"haswell", 2},    {"zen", 2},        {"skylakex", 3},  {"cooperlake", 4}, {"sapphirerapids", 5},
  };
  for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
    if (name && strcasecmp(name, cores[i].name) == 0) return cores[i].level;
  return -1;
}

/* The best OpenBLAS 0.3.21 core for this CPU's vector ISA, or NULL. */
static const char *best_core_for_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return "CooperLake";
  if (avx512) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

static char blas_core_note[200] = "OpenBLAS";

/* nabla runs OpenBLAS on one thread per call, but a program that also calls
 * it threaded (a benchmark's direct sgemm, a peer library in the same
 * process) leaves OpenBLAS's idle threads spinning for 2^28 cycles (a tenth
 * of a second) after each such call, taking the cores from our pool (the
 * matmul bench's products ran at half speed after its direct sgemm runs).
 * OPENBLAS_THREAD_TIMEOUT=4 (2^4 cycles) makes them sleep at once; OpenBLAS
 * reads it with the environment at load and applies it when its threads
 * start, so read it again and stop the threads (the next threaded call
 * starts them). Not when the user set it. */
static void quiet_blas_threads(void) {
  if (getenv("OPENBLAS_THREAD_TIMEOUT") || !openblas_read_env || !blas_thread_shutdown_) return;
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
  openblas_read_env();
  unsetenv("OPENBLAS_THREAD_TIMEOUT");
  blas_thread_shutdown_();
  size_t n = strlen(blas_core_note);
  snprintf(blas_core_note + n, sizeof blas_core_note - n, "; idle threads sleep at once");
}

static void select_blas_core(void) {
  const char *picked = openblas_get_corename();
  snprintf(blas_core_note, sizeof blas_core_note, "OpenBLAS %s", picked ? picked : "?");
  const char *mode = getenv("NABLA_BLAS_CORETYPE");
  if (getenv("OPENBLAS_CORETYPE") || (mode && strcmp(mode, "keep") == 0)) return;
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
  bool forced = mode && *mode && strcmp(mode, "auto") != 0;
  const char *want = forced ? mode : best_core_for_cpu();
  if (!want) return;
  if (forced && core_level(want) < 0) {
    snprintf(blas_core_note, sizeof blas_core_note, "OpenBLAS %s (NABLA_BLAS_CORETYPE=%s is not a core it has)",
             picked ? picked : "?", want);
    return;
  }
  int have = core_level(picked);
  bool keep = forced ? picked && strcasecmp(picked, want) == 0 : have < 0 || have >= core_level(want);
  if (keep) return;
  /* OpenBLAS reads OPENBLAS_CORETYPE in its init; put the environment back after */
  setenv("OPENBLAS_CORETYPE", want, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  const char *now = openblas_get_corename();
  snprintf(blas_core_note, sizeof blas_core_note, "OpenBLAS %s (it picked %s for this CPU)", now ? now : "?",
           picked ? picked : "?");
}

static char dot_note[300];

static void configure_blas(void) {
  select_blas_core();
  quiet_blas_threads();
  snprintf(dot_note, sizeof dot_note, "f32: nabla's sgemm (%s kernel); f64: %s", nb_cpu__sgemm_name(nb_cpu__sgemm_best()),
           blas_core_note);
}

const char *nb_jit_blas_core(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, configure_blas);
  return dot_note;
}

static bool is_float(nb_dtype t) { return t == NB_F16 || t == NB_BF16 || t == NB_F32 || t == NB_F64; }

/* b held as panels of NB_SGEMM_PANEL columns (sgemm.h): dot_general's rhs
 * f32 [n / 64, k, 64] contracted along its middle dim, in place. Its two
 * free dims do not merge into one axis, so without this it would be packed
 * again on every call. */
static bool in_panels(const nb_dot_plan *p) {
  const nb_dot_operand *o = &p->b;
  return p->ct == NB_F32 && o->dt == NB_F32 && !o->merged && o->nfree == 2 && o->ncon == 1 &&
         o->fext[1] == NB_SGEMM_PANEL && o->fstr[1] == 1 && o->fstr[0] == NB_SGEMM_PANEL * p->k &&
         o->cstr[0] == NB_SGEMM_PANEL;
}

static bool direct(const nb_dot_operand *o, nb_dtype ct) {
  bool t;
  int64_t ld;
  return o->dt == ct && o->merged && nb_dot__as_blas(o->rows, o->cols, o->rs, o->cs, &t, &ld);
}

/* element offset of batch item b in an operand with batch strides bstr */
static int64_t batch_offset(const nb_dot_plan *p, const int64_t *bstr, int64_t b) {
  int64_t off = 0;
  for (int i = p->nb - 1; i >= 0; i--) {
    off += b % p->bext[i] * bstr[i];
    b /= p->bext[i];
  }
  return off;
}

/* ---------------------------------------------------------------- packing */

/* offsets of every multi-index of dims (ext, str), row-major */
static void offsets(int n, const int64_t *ext, const int64_t *str, int64_t *out) {
  int64_t count = 1;
  out[0] = 0;
  for (int d = 0; d < n; d++) {
    /* out[i * ext + j] = out[i] + j * str, built in place from the back */
    for (int64_t i = count - 1; i >= 0; i--)
      for (int64_t j = ext[d] - 1; j >= 0; j--) out[i * ext[d] + j] = out[i] + j * str[d];
    count *= ext[d];
  }
}

static double load(nb_dtype t, const char *base, int64_t i) {
  switch (t) {
  case NB_F32: return ((const float *)base)[i];
  case NB_F64: return ((const double *)base)[i];
  case NB_BF16: {
    uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
  }
  default: return nb__load_f64(t, base, i);
  }
}

/* One packing: rows [lo, hi) of the flattened (batch, outer) space. */
typedef struct pack_job {
  const nb_dot_plan *p;
  const nb_dot_operand *o;
  nb_dtype ct;
  char *dst;
  const int64_t *outer, *inner;
  int64_t R, C, units, ntasks;
} pack_job;

static void pack_rows(const pack_job *j, int64_t lo, int64_t hi) {
  const nb_dot_operand *o = j->o;
  const char *src = o->base;
  int64_t C = j->C, item = o->rows * o->cols;
  for (int64_t u = lo; u < hi; u++) {
    int64_t b = u / j->R, r = u % j->R;
    int64_t base = batch_offset(j->p, o->bstr, b) + j->outer[r], at = b * item + r * C;
    const int64_t *inner = j->inner;
    if (j->ct == NB_F32) {
      float *d = (float *)j->dst + at;
      if (o->dt == NB_BF16)
        for (int64_t c = 0; c < C; c++) {
          uint32_t bits = (uint32_t)((const uint16_t *)src)[base + inner[c]] << 16;
          memcpy(d + c, &bits, 4);
        }
      else if (o->dt == NB_F32)
        for (int64_t c = 0; c < C; c++) d[c] = ((const float *)src)[base + inner[c]];
      else
        for (int64_t c = 0; c < C; c++) d[c] = (float)load(o->dt, src, base + inner[c]);
    } else {
      double *d = (double *)j->dst + at;
      for (int64_t c = 0; c < C; c++) d[c] = load(o->dt, src, base + inner[c]);
    }
  }
}

static void pack_task(void *arg, int t) {
  const pack_job *j = arg;
  pack_rows(j, j->units * t / j->ntasks, j->units * (t + 1) / j->ntasks);
}

/* Packs o into dst ([batch][rows][cols], or [batch][cols][rows] when the
 * source walks the contracting dims faster: reads and writes then both run
 * along memory) as dtype ct, split over the pool; sets o to describe dst.
 * tab holds rows + cols offsets. */
static void pack(const nb_dot_plan *p, nb_dot_operand *o, nb_dtype ct, char *dst, int64_t *tab, nb_pool *pool) {
  int64_t *ro = tab, *co = tab + o->rows;
  offsets(o->nfree, o->fext, o->fstr, ro);
  offsets(o->ncon, o->cext, o->cstr, co);
  int64_t fmin = INT64_MAX, cmin = INT64_MAX;
  for (int i = 0; i < o->nfree; i++)
    if (o->fext[i] > 1 && o->fstr[i] < fmin) fmin = o->fstr[i];
  for (int i = 0; i < o->ncon; i++)
    if (o->cext[i] > 1 && o->cstr[i] < cmin) cmin = o->cstr[i];
  bool cols_inner = cmin <= fmin;
  pack_job j = {p, o, ct, dst, cols_inner ? ro : co, cols_inner ? co : ro, cols_inner ? o->rows : o->cols,
                cols_inner ? o->cols : o->rows, 0, 1};
  j.units = p->batch * j.R;
  int64_t threads = nb_cpu__pool_threads(pool), by_work = j.units * j.C / PACK_TASK_ELEMS;
  j.ntasks = by_work < TASKS_PER_THREAD * threads ? by_work : TASKS_PER_THREAD * threads;
  if (j.ntasks > j.units) j.ntasks = j.units;
  if (j.ntasks <= 1) pack_rows(&j, 0, j.units);
  else nb_cpu__pool_run(pool, (int)j.ntasks, pack_task, &j);
  int64_t item = o->rows * o->cols;
  o->base = dst;
  o->dt = ct;
  o->merged = true;
  o->rs = cols_inner ? o->cols : 1;
  o->cs = cols_inner ? 1 : o->rows;
  int64_t s = item; /* packed items follow each other */
  for (int i = p->nb - 1; i >= 0; i--) o->bstr[i] = s, s *= p->bext[i];
}

/* ---------------------------------------------------------------- gemm */

/* Every product is cut into tiles of its result by its shape alone, never by
 * the number of threads, and each tile is one sgemm/dgemm on one OpenBLAS
 * thread, run on the thread pool. A tile's elements are then computed by
 * the same call whatever the thread count, so results are bit-identical at
 * 1, 2 or N threads: OpenBLAS's own results depend on how a product is split
 * (its edge kernels sum in another order; its threaded path splits by the
 * thread count), which made a 2-thread training run differ from a 1-thread
 * one in the last bits (OpenBLAS Haswell kernels; tests/compile/test_jit_dot.c).
 * Each tile packs its rows of A and its columns of B again, so tiles are as
 * large as the parallelism allows: a product is halved along the longer side
 * of its tiles, while they keep TILE_MIN_SIDE and TILE_MIN_MNK of work, until
 * it (with its batch) has TARGET_TASKS tasks: enough to share out over the
 * threads of most machines, with some left to even out a core that other
 * work slows (a 4096x3072 result: 4 x 4 tiles of 1024 x 768). The MLP
 * products run at 95.5-99.5% of one direct 2-thread sgemm (91-95% with tiles
 * of at most 512 a side; bench/matmul_vs_sgemm.c, bench/RESULTS.md session 4). */
#define TILE_MIN_SIDE 128
#define TILE_MIN_MNK (1 << 16)
#define TARGET_TASKS 16
#define TILE_ALIGN 16 /* tile sides are multiples of this: whole micro-kernel blocks of OpenBLAS */
/* and of NB_SGEMM_PANEL along n for b in panels */

typedef struct gemm_job {
  const nb_dot_plan *p;
  bool ta, tb;
  bool panels;      /* b in panels (in_panels): tiles of whole panels */
  int64_t lda, ldb;
  char *c;          /* [batch][m][n] of ct */
  int64_t tm, tn;   /* tiles per item along m and n */
  int64_t bm, bn;   /* rows and columns per tile (the last ones may be shorter) */
  int64_t first;    /* task index of this pool run's task 0 */
  atomic_bool oom;  /* a task found no memory for its packing buffers */
} gemm_job;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The tile side for `tiles` tiles over `side`: rounded up to TILE_ALIGN
 * once past it; to whole panels always. */
static int64_t tile_side(int64_t side, int64_t tiles, bool panels) {
  int64_t b = cdiv(side, tiles);
  if (panels) return cdiv(b, NB_SGEMM_PANEL) * NB_SGEMM_PANEL;
  return b > TILE_ALIGN ? cdiv(b, TILE_ALIGN) * TILE_ALIGN : b;
}

/* Sets j's tiling from the product's shape (see above). An f32 product's
 * elements do not depend on its tiles (sgemm.h), so it is cut only as far as
 * the threads need: whole at one thread (each tile packs its operands again).
 * A few rows times B, a streaming read of B, is cut into one band per
 * thread: with B untransposed every band reads a piece of each row of B, and
 * the longer the pieces, the closer to a plain read (Zen 4, 2 threads, 768-
 * and 2048-wide B: 4 bands a thread 0.71-0.83 of a plain read, 1 band
 * 0.89-1.00; bench/RESULTS.md, session 13); with B transposed a band is
 * whole rows, one contiguous stream a thread. */
static void plan_tiles(const nb_dot_plan *p, gemm_job *j, int threads) {
  bool stream = p->m <= NB_SGEMM_FEW_ROWS;
  int64_t per_thread = stream ? 1 : TASKS_PER_THREAD;
  int64_t tm = 1, tn = 1, target = p->ct == NB_F32 ? (threads > 1 ? per_thread * threads : 1) : TARGET_TASKS;
  while (p->batch * tm * tn < target) {
    int64_t bm = cdiv(p->m, tm), bn = cdiv(p->n, tn);
    bool can_m = bm >= 2 * TILE_MIN_SIDE, can_n = bn >= 2 * TILE_MIN_SIDE;
    if (!can_m && !can_n) break;
    bool along_m = can_m && (bm >= bn || !can_n);
    double work = (double)(along_m ? cdiv(bm, 2) * bn : bm * cdiv(bn, 2)) * (double)p->k;
    if (work < TILE_MIN_MNK) break;
    if (along_m) tm *= 2;
    else tn *= 2;
  }
  j->bm = tile_side(p->m, tm, false), j->bn = tile_side(p->n, tn, j->panels);
  j->tm = cdiv(p->m, j->bm), j->tn = cdiv(p->n, j->bn);
}

static void gemm_task(void *arg, int t) {
  gemm_job *j = arg; /* not const: a task may set j->oom */
  const nb_dot_plan *p = j->p;
  int64_t task = j->first + t, per_item = j->tm * j->tn, b = task / per_item, tile = task % per_item;
  int64_t i0 = tile / j->tn * j->bm, j0 = tile % j->tn * j->bn;
  int64_t m = p->m - i0 < j->bm ? p->m - i0 : j->bm, n = p->n - j0 < j->bn ? p->n - j0 : j->bn;
  size_t es = p->ct == NB_F32 ? 4 : 8;
  int64_t ao = batch_offset(p, p->a.bstr, b) + (j->ta ? i0 : i0 * j->lda);
  int64_t bo = batch_offset(p, p->b.bstr, b) + (j->panels ? j0 * p->k : j->tb ? j0 * j->ldb : j0);
  int64_t co = b * p->m * p->n + i0 * p->n + j0;
  const char *A = p->a.base + (size_t)ao * es, *B = p->b.base + (size_t)bo * es;
  char *C = j->c + (size_t)co * es;
  enum CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans, tb = j->tb ? CblasTrans : CblasNoTrans;
  if (j->panels) {
    if (!nb_cpu__sgemm_panels(j->ta, m, n, p->k, (const float *)A, j->lda, (const float *)B, (float *)C, p->n))
      atomic_store(&j->oom, true);
  } else if (p->ct == NB_F32) {
    if (!nb_cpu__sgemm(j->ta, j->tb, m, n, p->k, (const float *)A, j->lda, (const float *)B, j->ldb, (float *)C, p->n))
      atomic_store(&j->oom, true);
  } else
    cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)p->k, 1.0, (const double *)A, (int)j->lda, (const double *)B,
                (int)j->ldb, 0.0, (double *)C, (int)p->n);
}

static void run_gemms(gemm_job *j, nb_pool *pool) {
  nb_jit_blas_core();
  plan_tiles(j->p, j, nb_cpu__pool_threads(pool));
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  int64_t ntasks = j->p->batch * j->tm * j->tn;
  for (j->first = 0; j->first < ntasks; j->first += INT32_MAX) /* pool task indices are ints */
    nb_cpu__pool_run(pool, (int)(ntasks - j->first < INT32_MAX ? ntasks - j->first : INT32_MAX), gemm_task, j);
}

static void convert_out(const nb_dot_plan *p, const char *src, void *out) {
  int64_t n = p->batch * p->m * p->n;
  if (p->ct == NB_F32)
    for (int64_t i = 0; i < n; i++) nb__store_f64(p->ot, out, i, ((const float *)src)[i]);
  else
    for (int64_t i = 0; i < n; i++) nb__store_f64(p->ot, out, i, ((const double *)src)[i]);
}

#else
const char *nb_jit_blas_core(void) { return "none (built without BLAS)"; }
#endif /* NABLA_HAVE_CBLAS */

bool nb_cpu__blas_supported(const nb_eqn *e) {
#ifdef NABLA_HAVE_CBLAS
  if (!nb__rules(e->prim)->gemm || e->nin != 2 || e->nout != 1 || !e->params) return false;
  nb_dtype t = e->in[0]->aval.dtype;
  if (!is_float(t) || e->in[1]->aval.dtype != t || !is_float(e->out[0]->aval.dtype)) return false;
  nb_dot_plan p;
  nb_dot__plan_of(e, &p);
  /* packed operands have leading dims of at most max(m, n, k) */
  return p.m < (1ll << 31) && p.n < (1ll << 31) && p.k < (1ll << 31);
#else
  (void)e;
  return false;
#endif
}

nb_status nb_cpu__blas_run(nb_ctx *ctx, nb_pool *pool, const nb_eqn *e, const void *lhs, const void *rhs, void *out) {
#ifdef NABLA_HAVE_CBLAS
  nb_dot_plan p;
  nb_dot__plan_of(e, &p);
  p.a.base = lhs, p.b.base = rhs;
  size_t es = p.ct == NB_F32 ? 4 : 8;
  if (p.batch == 0 || p.m == 0 || p.n == 0) return NB_OK;
  if (p.k == 0) {
    memset(out, 0, (size_t)(p.batch * p.m * p.n) * (size_t)nb_dtype_size(p.ot)); /* +0.0 in every float dtype */
    return NB_OK;
  }
  bool panels = in_panels(&p);
  bool pa = !direct(&p.a, p.ct), pb = !panels && !direct(&p.b, p.ct), pc = p.ot != p.ct;
  /* scratch: offset tables, then packed lhs, rhs and the result, each on 64 bytes */
#define ROUND64(x) (((x) + 63) & ~(size_t)63)
  size_t st = pa || pb ? ROUND64((size_t)(p.m + p.n + 2 * p.k) * sizeof(int64_t)) : 0;
  size_t sa = pa ? ROUND64((size_t)(p.batch * p.m * p.k) * es) : 0, sb = pb ? ROUND64((size_t)(p.batch * p.n * p.k) * es) : 0;
  size_t sc = pc ? (size_t)(p.batch * p.m * p.n) * es : 0, total = st + sa + sb + sc;
#undef ROUND64
  char *scratch = NULL;
  if (total && !(scratch = nb_alloc(ctx, total)))
    return nb_errorf(ctx, NB_ERR_NOMEM, "dot_general: out of memory for a %zu-byte BLAS scratch (traced at %s:%d)", total,
                     e->loc.file ? e->loc.file : "?", e->loc.line);
  int64_t *tab = (int64_t *)scratch;
  if (pa) pack(&p, &p.a, p.ct, scratch + st, tab, pool);
  if (pb) pack(&p, &p.b, p.ct, scratch + st + sa, tab + p.m + p.k, pool);
  gemm_job j = {.p = &p, .panels = panels, .c = pc ? scratch + st + sa + sb : out};
  nb_dot__as_blas(p.m, p.k, p.a.rs, p.a.cs, &j.ta, &j.lda); /* it succeeds: a is direct now */
  if (!panels) { /* b is direct now too (panels: their own layout, no tb / ldb) */
    bool t = false;
    nb_dot__as_blas(p.n, p.k, p.b.rs, p.b.cs, &t, &j.ldb);
    j.tb = !t; /* b is N x K; BLAS wants K x N */
  }
  run_gemms(&j, pool);
  if (pc && !atomic_load(&j.oom)) convert_out(&p, j.c, out);
  nb_dealloc(ctx, scratch, total);
  if (atomic_load(&j.oom))
    return nb_errorf(ctx, NB_ERR_NOMEM, "dot_general: out of memory for the matmul's packing buffers (traced at %s:%d)",
                     e->loc.file ? e->loc.file : "?", e->loc.line);
  return NB_OK;
#else
  (void)ctx, (void)pool, (void)lhs, (void)rhs, (void)out;
  return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "dot_general: built without BLAS (%s)", nb__rules(e->prim)->name);
#endif
}

