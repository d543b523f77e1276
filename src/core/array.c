/* nb_array: immutable, reference-counted host arrays (the device field is
 * there for the CUDA backend). Creation, access, conversion and printing.
 * Not here: any computation over arrays (that is the interpreter's). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/ir.h"

static bool check_shape(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const char *what) {
  if (t < 0 || t >= NB_DTYPE_COUNT) return nb_errorf(ctx, NB_ERR_DTYPE, "%s: invalid dtype %d", what, (int)t), false;
  if (rank < 0 || rank > NB_MAX_RANK)
    return nb_errorf(ctx, NB_ERR_SHAPE, "%s: rank %d outside [0, %d]", what, rank, NB_MAX_RANK), false;
  if (rank > 0 && !dims) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "%s: dims is NULL for rank %d", what, rank), false;
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0) return nb_errorf(ctx, NB_ERR_SHAPE, "%s: negative dim %lld at axis %d", what, (long long)dims[i], i), false;
    if (dims[i] && n > (INT64_MAX / 16) / dims[i])
      return nb_errorf(ctx, NB_ERR_SHAPE, "%s: shape too large", what), false;
    n *= dims[i];
  }
  return true;
}

static nb_array *new_header(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims) {
  nb_array *a = nb_calloc(ctx, sizeof *a);
  if (!a) return NULL;
  a->ctx = ctx;
  atomic_init(&a->refcount, 1);
  a->aval = nb_aval_make(t, rank, dims);
  a->device = NB_CPU;
  a->nbytes = (size_t)nb_shape_size(&a->aval.shape) * nb_dtype_size(t);
  return a;
}

nb_array *nb_array_empty(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims) {
  if (!check_shape(ctx, t, rank, dims, "nb_array_empty")) return NULL;
  nb_array *a = new_header(ctx, t, rank, dims);
  if (!a) return NULL;
  a->data = nb_alloc(ctx, a->nbytes);
  if (!a->data) {
    nb_dealloc(ctx, a, sizeof *a);
    return NULL;
  }
  return a;
}

nb_array *nb_array_wrap(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const void *data,
                        void (*release)(void *ud), void *ud) {
  if (!check_shape(ctx, t, rank, dims, "nb_array_wrap")) return NULL;
  if ((uintptr_t)data % nb_dtype_size(t) != 0) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_wrap: data %p not aligned to %s", data, nb_dtype_name(t));
    return NULL;
  }
  nb_array *a = new_header(ctx, t, rank, dims);
  if (!a) return NULL;
  a->data = (void *)data;
  a->release = release;
  a->release_ud = ud;
  return a;
}

nb_array *nb_array_create(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const void *data) {
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  if (!a) return NULL;
  if (data) memcpy(a->data, data, a->nbytes);
  else memset(a->data, 0, a->nbytes);
  return a;
}

nb_array *nb_array_full(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, double value) {
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  if (!a) return NULL;
  int64_t n = nb_shape_size(&a->aval.shape);
  if (n == 0) return a;
  nb__store_f64(t, a->data, 0, value);
  size_t es = nb_dtype_size(t);
  for (int64_t i = 1; i < n; i++) memcpy((char *)a->data + i * es, a->data, es);
  return a;
}

nb_array *nb_array_zeros(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims) {
  return nb_array_create(ctx, t, rank, dims, NULL);
}
nb_array *nb_array_ones(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims) {
  return nb_array_full(ctx, t, rank, dims, 1.0);
}
nb_array *nb_array_scalar(nb_ctx *ctx, nb_dtype t, double value) {
  return nb_array_full(ctx, t, 0, NULL, value);
}

nb_array *nb_array_arange(nb_ctx *ctx, nb_dtype t, double start, double stop, double step) {
  if (step == 0 || step != step || start != start || stop != stop) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_arange: step must be finite and non-zero");
    return NULL;
  }
  double count = ceil((stop - start) / step);
  int64_t n = count > 0 ? (int64_t)count : 0;
  nb_array *a = nb_array_empty(ctx, t, 1, &n);
  if (!a) return NULL;
  for (int64_t i = 0; i < n; i++) nb__store_f64(t, a->data, i, start + (double)i * step);
  return a;
}

nb_array *nb_array_iota(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, int axis) {
  if (axis < 0 || axis >= rank) {
    nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_iota: axis %d out of range for rank %d", axis, rank);
    return NULL;
  }
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  if (!a) return NULL;
  int64_t strides[NB_MAX_RANK];
  nb__strides(&a->aval.shape, strides);
  int64_t n = nb_shape_size(&a->aval.shape);
  for (int64_t i = 0; i < n; i++) nb__store_i64(t, a->data, i, (i / strides[axis]) % dims[axis]);
  return a;
}

nb_array *nb_array_from_f64(nb_ctx *ctx, nb_dtype t, int rank, const int64_t *dims, const double *values) {
  nb_array *a = nb_array_empty(ctx, t, rank, dims);
  if (!a) return NULL;
  nb_convert_elements(t, a->data, NB_F64, values, nb_shape_size(&a->aval.shape));
  return a;
}

nb_array *nb_array_astype(nb_ctx *ctx, nb_array *a, nb_dtype t) {
  if (!a) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_astype: NULL array"), NULL;
  if (a->aval.dtype == t) {
    nb_array_retain(a);
    return a;
  }
  nb_array *b = nb_array_empty(ctx, t, a->aval.shape.rank, a->aval.shape.dims);
  if (!b) return NULL;
  nb_convert_elements(t, b->data, a->aval.dtype, a->data, nb_shape_size(&a->aval.shape));
  return b;
}

/* Tiles of 32 x 32 keep both sides in cache. */
#define TRANSPOSE_TILED(T)                                                                               \
  do {                                                                                                    \
    const T *src = x->data;                                                                               \
    T *dst = y->data;                                                                                     \
    for (int64_t i0 = 0; i0 < r; i0 += 32)                                                                \
      for (int64_t j0 = 0; j0 < c; j0 += 32)                                                              \
        for (int64_t i = i0; i < i0 + 32 && i < r; i++)                                                   \
          for (int64_t j = j0; j < j0 + 32 && j < c; j++) dst[j * r + i] = src[i * c + j];                 \
  } while (0)

nb_array *nb_array_transpose2d(nb_ctx *ctx, const nb_array *x) {
  if (!x || x->aval.shape.rank != 2 || !x->data)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_transpose2d: %s", !x ? "NULL array" : !x->data ? "not a host array" : "rank is not 2"),
           NULL;
  int64_t r = x->aval.shape.dims[0], c = x->aval.shape.dims[1], td[2] = {c, r};
  nb_array *y = nb_array_empty(ctx, x->aval.dtype, 2, td);
  if (!y) return NULL;
  switch (nb_dtype_size(x->aval.dtype)) {
  case 1: TRANSPOSE_TILED(uint8_t); break;
  case 2: TRANSPOSE_TILED(uint16_t); break;
  case 4: TRANSPOSE_TILED(uint32_t); break;
  default: TRANSPOSE_TILED(uint64_t); break;
  }
  return y;
}
#undef TRANSPOSE_TILED

void nb_array_retain(nb_array *a) {
  if (a) atomic_fetch_add(&a->refcount, 1);
}

bool nb__array_is_sole_owner(const nb_array *a) {
  return atomic_load(&a->refcount) == 1 && !a->release && a->device.kind == NB_DEVICE_CPU;
}

void nb_array_release(nb_array *a) {
  if (!a || atomic_fetch_sub(&a->refcount, 1) != 1) return;
  nb_ctx *ctx = a->ctx;
  if (a->release) a->release(a->release_ud);
  else if (a->data) nb_dealloc(ctx, a->data, a->nbytes);
  nb_dealloc(ctx, a, sizeof *a);
}

nb_dtype nb_array_dtype(const nb_array *a) { return a->aval.dtype; }
int nb_array_rank(const nb_array *a) { return a->aval.shape.rank; }
const int64_t *nb_array_dims(const nb_array *a) { return a->aval.shape.dims; }
int64_t nb_array_size(const nb_array *a) { return nb_shape_size(&a->aval.shape); }
size_t nb_array_nbytes(const nb_array *a) { return a->nbytes; }
nb_aval nb_array_aval(const nb_array *a) { return a->aval; }
nb_device nb_array_device(const nb_array *a) { return a->device; }
nb_ctx *nb_array_ctx(const nb_array *a) { return a->ctx; }
const void *nb_array_data(const nb_array *a) { return a->device.kind == NB_DEVICE_CPU ? a->data : NULL; }
void *nb_array_data_mut(nb_array *a) { return a->device.kind == NB_DEVICE_CPU ? a->data : NULL; }

nb_status nb_array_copy_out(nb_ctx *ctx, const nb_array *a, void *dst, size_t nbytes) {
  if (!a || (!dst && nbytes)) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_copy_out: NULL argument");
  if (nbytes != a->nbytes)
    return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_array_copy_out: destination holds %zu bytes, array has %zu",
                     nbytes, a->nbytes);
  if (a->device.kind != NB_DEVICE_CPU)
    return nb_errorf(ctx, NB_ERR_UNIMPLEMENTED, "nb_array_copy_out: device arrays need the CUDA runtime");
  if (nbytes) memcpy(dst, a->data, nbytes);
  return NB_OK;
}

double nb_array_get(const nb_array *a, int64_t i) { return nb__load_f64(a->aval.dtype, a->data, i); }

bool nb_array_equal(const nb_array *a, const nb_array *b) {
  return nb_aval_equal(&a->aval, &b->aval) && memcmp(a->data, b->data, a->nbytes) == 0;
}

static void print_elem(const nb_array *a, int64_t i, FILE *f) {
  nb_dtype t = a->aval.dtype;
  if (t == NB_BOOL) fputs(((const uint8_t *)a->data)[i] ? "true" : "false", f);
  else if (nb_dtype_is_float(t)) fprintf(f, "%.6g", nb__load_f64(t, a->data, i));
  else fprintf(f, "%lld", (long long)nb__load_i64(t, a->data, i));
}

/* Prints nested brackets; along each axis at most 6 entries (first 3, last 3). */
static void print_rec(const nb_array *a, int axis, int64_t offset, const int64_t *strides, FILE *f) {
  const nb_shape *s = &a->aval.shape;
  if (axis == s->rank) {
    print_elem(a, offset, f);
    return;
  }
  fputc('[', f);
  int64_t n = s->dims[axis];
  for (int64_t i = 0; i < n; i++) {
    if (n > 6 && i == 3) {
      fputs("..., ", f);
      i = n - 3;
    }
    print_rec(a, axis + 1, offset + i * strides[axis], strides, f);
    if (i + 1 < n) fputs(", ", f);
  }
  fputc(']', f);
}

void nb_array_print(const nb_array *a, FILE *f) {
  char buf[128];
  fprintf(f, "%s ", nb_aval_str(&a->aval, buf, sizeof buf));
  if (a->device.kind != NB_DEVICE_CPU) {
    fputs("<on device>\n", f);
    return;
  }
  int64_t strides[NB_MAX_RANK];
  nb__strides(&a->aval.shape, strides);
  print_rec(a, 0, 0, strides, f);
  fputc('\n', f);
}
