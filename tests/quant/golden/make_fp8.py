"""Golden fp8 encodings for tests/quant/test_codec.c, from ml_dtypes'
float32 -> float8_e4m3fn / float8_e5m2 casts (round to nearest even): every
midpoint between neighbouring finite values and the floats either side of
it, every finite value, and log-uniform random floats, all within the
finite range (beyond it ml_dtypes gives NaN / inf, nabla saturates: not
compared). One line per value: the f32's bits and the code, in hex.
Run from this folder: python3 make_fp8.py  (needs numpy and ml_dtypes)"""
import ml_dtypes
import numpy as np

rng = np.random.RandomState(808)


def values(fmt):
    codes = np.arange(256, dtype=np.uint8).view(fmt).astype(np.float64)
    finite = np.sort(np.unique(codes[np.isfinite(codes)]))
    mx = finite[-1]
    mids = (finite[1:] + finite[:-1]) / 2
    xs = [finite.astype(np.float32), mids.astype(np.float32)]
    m32 = mids.astype(np.float32)
    xs += [np.nextafter(m32, np.float32(np.inf)), np.nextafter(m32, np.float32(-np.inf))]
    mag = np.exp2(rng.uniform(np.log2(mx) - 30, np.log2(mx), 1000)) * rng.choice([-1.0, 1.0], 1000)
    xs.append(mag.astype(np.float32))
    x = np.concatenate(xs)
    return x[np.abs(x.astype(np.float64)) <= mx]


with open("fp8.txt", "w") as f:
    f.write("# f32 bits, e4m3fn code / e5m2 code (ml_dtypes %s); see make_fp8.py\n" % ml_dtypes.__version__)
    for name, fmt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        x = values(fmt)
        codes = x.astype(fmt).view(np.uint8)
        for xi, c in zip(x.view(np.uint32), codes):
            f.write("%s %08x %02x\n" % (name, xi, c))
