/* The context: allocator hook with exact byte counts and fault injection,
 * the sticky error message, logging and debug settings. Not here: anything
 * about arrays or graphs. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

static const char *const status_names[NB_STATUS_COUNT] = {
    [NB_OK] = "ok",
    [NB_ERR_INVALID_ARG] = "invalid argument",
    [NB_ERR_SHAPE] = "shape error",
    [NB_ERR_DTYPE] = "dtype error",
    [NB_ERR_NOMEM] = "out of memory",
    [NB_ERR_IO] = "I/O error",
    [NB_ERR_FORMAT] = "format error",
    [NB_ERR_UNIMPLEMENTED] = "unimplemented",
    [NB_ERR_NUMERIC] = "numeric error",
    [NB_ERR_NOT_FOUND] = "not found",
    [NB_ERR_INTERNAL] = "internal error",
};

const char *nb_status_name(nb_status s) {
  return (s >= 0 && s < NB_STATUS_COUNT) ? status_names[s] : "unknown status";
}

static void *default_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
  (void)ud;
  if (new_size == 0) {
    free(ptr);
    return NULL;
  }
  size_t rounded = (new_size + NB_ARRAY_ALIGN - 1) / NB_ARRAY_ALIGN * NB_ARRAY_ALIGN;
  void *p = aligned_alloc(NB_ARRAY_ALIGN, rounded);
  if (p && ptr) {
    memcpy(p, ptr, old_size < new_size ? old_size : new_size);
    free(ptr);
  }
  return p;
}

/* Warnings and errors always; info and debug when the context's debug level
 * is above 0 (NABLA_DEBUG), so diagnostics show without a custom callback. */
static void default_log(void *ud, nb_log_level level, const char *msg) {
  const nb_ctx *ctx = ud;
  static const char *const names[NB_LOG_LEVEL_COUNT] = {"debug", "info", "warning", "error"};
  if (level >= NB_LOG_WARN || (ctx && ctx->debug_level > 0)) fprintf(stderr, "nabla %s: %s\n", names[level], msg);
}

nb_ctx *nb_ctx_create_with_allocator(nb_alloc_fn fn, void *ud) {
  if (!fn) fn = default_alloc;
  nb_ctx *ctx = fn(ud, NULL, 0, sizeof(nb_ctx));
  if (!ctx) return NULL;
  memset(ctx, 0, sizeof *ctx);
  ctx->alloc = fn;
  ctx->alloc_ud = ud;
  ctx->log = default_log;
  ctx->log_ud = ctx;
  pthread_mutex_init(&ctx->err_lock, NULL);
  const char *dbg = getenv("NABLA_DEBUG");
  if (dbg) ctx->debug_level = atoi(dbg);
  const char *nans = getenv("NABLA_DEBUG_NANS");
  if (nans && *nans && strcmp(nans, "0") != 0) ctx->debug_nans = true;
  const char *prng = getenv("NABLA_PRNG");
  if (prng && !strcmp(prng, "threefry_partitionable")) ctx->prng = NB_PRNG_THREEFRY_PARTITIONABLE;
  else if (prng && *prng && strcmp(prng, "threefry") != 0)
    nb_logf(ctx, NB_LOG_WARN, "NABLA_PRNG='%s' is not 'threefry' or 'threefry_partitionable': using threefry", prng);
  return ctx;
}

nb_ctx *nb_ctx_create(void) { return nb_ctx_create_with_allocator(NULL, NULL); }

void nb_ctx_destroy(nb_ctx *ctx) {
  if (!ctx) return;
  nb_custom_call_entry *e = ctx->custom_calls;
  while (e) {
    nb_custom_call_entry *next = e->next;
    nb_strfree(ctx, e->name);
    nb_dealloc(ctx, e, sizeof *e);
    e = next;
  }
  pthread_mutex_destroy(&ctx->err_lock);
  ctx->alloc(ctx->alloc_ud, ctx, sizeof *ctx, 0);
}

const char *nb_ctx_error(const nb_ctx *ctx) { return ctx ? ctx->errmsg : "no context"; }
nb_status nb_ctx_status(const nb_ctx *ctx) { return ctx ? ctx->status : NB_ERR_INVALID_ARG; }

void nb_ctx_clear_error(nb_ctx *ctx) {
  pthread_mutex_lock(&ctx->err_lock);
  ctx->status = NB_OK;
  ctx->errmsg[0] = 0;
  pthread_mutex_unlock(&ctx->err_lock);
}

/* Formats into a scratch buffer and copies it in: callers wrap the current
 * message (nb_errorf(ctx, s, "loading %s: %s", path, nb_ctx_error(ctx))), and
 * formatting straight into errmsg would read the buffer being written. */
nb_status nb_errorf(nb_ctx *ctx, nb_status status, const char *fmt, ...) {
  if (!ctx) return status;
  char msg[NB_ERRMSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&ctx->err_lock);
  ctx->status = status;
  memcpy(ctx->errmsg, msg, sizeof msg);
  pthread_mutex_unlock(&ctx->err_lock);
  if (ctx->debug_level >= 1) nb_logf(ctx, NB_LOG_DEBUG, "error: %s", ctx->errmsg);
  return status;
}

void nb_ctx_set_log(nb_ctx *ctx, nb_log_fn fn, void *ud) {
  ctx->log = fn;
  ctx->log_ud = ud;
}

void nb_logf(nb_ctx *ctx, nb_log_level level, const char *fmt, ...) {
  if (!ctx || !ctx->log) return;
  if (level == NB_LOG_DEBUG && ctx->debug_level <= 0) return;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ctx->log(ctx->log_ud, level, buf);
}

void nb_ctx_set_debug_level(nb_ctx *ctx, int level) { ctx->debug_level = level; }
int nb_ctx_debug_level(const nb_ctx *ctx) { return ctx->debug_level; }
void nb_ctx_set_debug_nans(nb_ctx *ctx, bool on) { ctx->debug_nans = on; }
void nb_ctx_set_prng_impl(nb_ctx *ctx, nb_prng_impl impl) { ctx->prng = impl; }
nb_prng_impl nb_ctx_prng_impl(const nb_ctx *ctx) { return ctx->prng; }

void *nb_alloc(nb_ctx *ctx, size_t bytes) {
  if (bytes == 0) bytes = 1;
  int64_t n = atomic_load(&ctx->fail_alloc_countdown);
  if (n > 0 && atomic_fetch_sub(&ctx->fail_alloc_countdown, 1) == 1) {
    nb_errorf(ctx, NB_ERR_NOMEM, "out of memory allocating %zu bytes (injected failure)", bytes);
    return NULL;
  }
  void *p = ctx->alloc(ctx->alloc_ud, NULL, 0, bytes);
  if (!p) {
    nb_errorf(ctx, NB_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
    return NULL;
  }
  size_t now = atomic_fetch_add(&ctx->bytes_in_use, bytes) + bytes;
  size_t peak = atomic_load(&ctx->peak_bytes);
  while (now > peak && !atomic_compare_exchange_weak(&ctx->peak_bytes, &peak, now)) {
  }
  return p;
}

void *nb_calloc(nb_ctx *ctx, size_t bytes) {
  void *p = nb_alloc(ctx, bytes);
  if (p) memset(p, 0, bytes ? bytes : 1);
  return p;
}

void nb_dealloc(nb_ctx *ctx, void *ptr, size_t bytes) {
  if (!ptr) return;
  if (bytes == 0) bytes = 1;
  atomic_fetch_sub(&ctx->bytes_in_use, bytes);
  ctx->alloc(ctx->alloc_ud, ptr, bytes, 0);
}

size_t nb_ctx_bytes_in_use(const nb_ctx *ctx) { return atomic_load(&ctx->bytes_in_use); }
size_t nb_ctx_peak_bytes(const nb_ctx *ctx) { return atomic_load(&ctx->peak_bytes); }
void nb_ctx_fail_alloc_after(nb_ctx *ctx, int64_t n) { atomic_store(&ctx->fail_alloc_countdown, n); }

char *nb_strdup(nb_ctx *ctx, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = nb_alloc(ctx, n);
  if (p) memcpy(p, s, n);
  return p;
}

void nb_strfree(nb_ctx *ctx, char *s) {
  if (s) nb_dealloc(ctx, s, strlen(s) + 1);
}

uint64_t nb__hash_bytes(const void *p, size_t n, uint64_t seed) {
  /* FNV-1a, 64-bit, then a final mix: IR hashing, not cryptography. */
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull ^ seed;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

uint64_t nb__hash_combine(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}
