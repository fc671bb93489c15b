r"""Optional native kernels for the products with J (C, compiled at first use; the eager path is the
reference and the default).

For m ~ 10 the BLAS kernels run the eager Gram's shape (a ``bmm`` of (m, 512) blocks,
:func:`~lit_constrained.optim.nullspace.scaled_gram`) far below the CPU's arithmetic rate: on the AMD
EPYC of docs/optim_measurements.md it costs 7 reads of J, J g one more; and the float64-product
products of the refinement (:func:`~lit_constrained.optim.nullspace.exact_matvec`, a float64 copy of
each chunk of J; the split :math:`J^T z_{hi} + J^T z_{lo}`) cost about three and two reads. Three
kernels do each in one pass over float32 J:

* :func:`gram`: :math:`G = J D^2 J^T` and :math:`J D v` (D = diag(d), the identity without d); both
  triangles of G from one product each. Every float32 product is accumulated in float32 over
  ``SPAN / 16`` columns (16 interleaved lanes, every 16th column), then in float64: the eager rounding
  model with smaller blocks, so within :func:`~lit_constrained.optim.nullspace.gram_error` (blocks of
  512 columns), which the refinement plan keeps using;
* :func:`exact_matvec`: :math:`J v` from float64 products (exact for float32 data) and float64 sums (16
  lanes), as the eager one but in another order of the float64 sums;
* :func:`exact_rmatvec`: :math:`J^T z` (or :math:`out + J^T z`: a refinement's correction added in the
  same pass) for a float64 z, accumulated over the rows in float64 and rounded to float32 once (the
  eager split's two float32 products, then the addition, approximate this rounding).

So their results differ from the eager path's in the last bits of each sum, within the same error
bounds (tested against float64 products); trajectories are not bit-identical to the eager ones.

Off by default. On: the environment variable ``LIT_CONSTRAINED_NATIVE=1`` (read at import) or
:func:`set_native` / the context manager :func:`native`. The kernels take float32 CPU operands (J with
unit column stride; :func:`gram` at most ``NATIVE_MAX_ROWS`` rows, its m x m accumulators in cache);
anything else, or a machine without a C compiler, takes the eager path (the failure to compile warns
once). The library is compiled with the system C compiler (``$CC``, else ``cc``; ``-O3 -march=native``)
into a cache directory (``$LIT_CONSTRAINED_CACHE``, else ``~/.cache/lit_constrained``) keyed by the
source, the compiler and the CPU, in well under a second. The kernels are single-threaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

NATIVE_ENV = "LIT_CONSTRAINED_NATIVE"
CACHE_ENV = "LIT_CONSTRAINED_CACHE"
NATIVE_MAX_ROWS = 64
"""The largest m the kernel takes (its float64 accumulators: 16 m^2 doubles)."""
SPAN = 2048
"""Columns a lane's float32 accumulator spans before it is added in float64 (SPAN / 16 products)."""

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd __attribute__((vector_size(64)));
#define LANES 16
#define TILE 5
#define SPAN @SPAN@

static inline vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }

/* the lanes 0-7 and 8-15 of a as doubles (memcpy of the halves: the compilers turn it into register
   moves; __builtin_convertvector needs GCC >= 9 or clang) */
static inline vd low(vf a) { vf8 h; memcpy(&h, &a, sizeof h); return __builtin_convertvector(h, vd); }
static inline vd high(vf a) { vf8 h; memcpy(&h, (const char *)&a + sizeof h, sizeof h); return __builtin_convertvector(h, vd); }

/* the two halves rounded to float and joined */
static inline vf join(vd lo, vd hi) {
    vf8 l = __builtin_convertvector(lo, vf8), h = __builtin_convertvector(hi, vf8);
    vf r;
    memcpy(&r, &l, sizeof l);
    memcpy((char *)&r + sizeof l, &h, sizeof h);
    return r;
}

/* acc[0..1] += (double) a, lane by lane */
static inline void flush(vd *acc, vf a) {
    acc[0] += low(a);
    acc[1] += high(a);
}

static inline double lane_sum(const vd *a) {
    double t[LANES];
    memcpy(t, a, sizeof t);
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) t[k] += t[k + w];
    return t[0];
}

/* s[p][q] = sum over columns k0..k1 of (a_p d)(b_q d), lane by lane */
static inline __attribute__((always_inline)) void tile(const int T, const float *const *a,
        const float *const *b, int64_t k0, int64_t k1, const float *d, vf s[TILE][TILE]) {
    for (int p = 0; p < T; p++)
        for (int q = 0; q < T; q++) s[p][q] = (vf){0};
    for (int64_t k = k0; k < k1; k += LANES) {
        vf x[TILE];
        vf dk = d ? load(d + k) : (vf){0};
        for (int p = 0; p < T; p++) { x[p] = load(a[p] + k); if (d) x[p] *= dk; }
        for (int q = 0; q < T; q++) {
            vf y = load(b[q] + k);
            if (d) y *= dk;
            for (int p = 0; p < T; p++) s[p][q] += x[p] * y;
        }
    }
}

/* the diagonal tile (b = a): s[p][q] for q <= p, and sv[p] = sum (a_p d) v when v is given */
static inline __attribute__((always_inline)) void diagonal_tile(const int T, const float *const *a,
        int64_t k0, int64_t k1, const float *d, const float *v, vf s[TILE][TILE], vf *sv) {
    for (int p = 0; p < T; p++) {
        sv[p] = (vf){0};
        for (int q = 0; q <= p; q++) s[p][q] = (vf){0};
    }
    for (int64_t k = k0; k < k1; k += LANES) {
        vf x[TILE];
        vf dk = d ? load(d + k) : (vf){0};
        for (int p = 0; p < T; p++) { x[p] = load(a[p] + k); if (d) x[p] *= dk; }
        for (int p = 0; p < T; p++)
            for (int q = 0; q <= p; q++) s[p][q] += x[p] * x[q];
        if (v) {
            vf vk = load(v + k);
            for (int p = 0; p < T; p++) sv[p] += x[p] * vk;
        }
    }
}

#define DISPATCH(call, T, ...) switch (T) { \
    case 1: call(1, __VA_ARGS__); break; case 2: call(2, __VA_ARGS__); break; \
    case 3: call(3, __VA_ARGS__); break; case 4: call(4, __VA_ARGS__); break; \
    default: call(5, __VA_ARGS__); break; }

/* G = J D^2 J^T (m x m float64, both triangles) and Jv = J D v (when v is given) for float32 J with m
   rows of stride ld and n unit-stride columns; d (the diagonal of D) and v may be NULL. 0 on success. */
int gram_f32(const float *J, int64_t m, int64_t ld, int64_t n, const float *d, const float *v,
             double *G, double *Jv) {
    const int T = m < TILE ? (int)m : TILE;
    const int64_t n16 = n / LANES * LANES, tiles = (m + T - 1) / T;
    const size_t count = (size_t)(m * m + m) * 2, bytes = (count * sizeof(vd) + 63) / 64 * 64;
    vd *acc = aligned_alloc(64, bytes);
    if (!acc) return 1;
    memset(acc, 0, bytes);
    vd *vacc = acc + m * m * 2;
    for (int64_t c0 = 0; c0 < n16; c0 += SPAN) {
        const int64_t c1 = c0 + SPAN < n16 ? c0 + SPAN : n16;
        for (int64_t ti = 0; ti < tiles; ti++) {
            const int64_t i0 = ti * T;
            const float *a[TILE];
            for (int t = 0; t < T; t++) a[t] = J + (i0 + t < m ? i0 + t : m - 1) * ld;  /* (rows past m: unused) */
            for (int64_t tj = 0; tj <= ti; tj++) {
                const int64_t j0 = tj * T;
                vf s[TILE][TILE], sv[TILE];
                if (tj == ti) {
                    DISPATCH(diagonal_tile, T, a, c0, c1, d, v, s, sv)
                    for (int p = 0; p < T && i0 + p < m; p++) {
                        for (int q = 0; q <= p; q++) flush(acc + ((i0 + p) * m + j0 + q) * 2, s[p][q]);
                        if (v) flush(vacc + (i0 + p) * 2, sv[p]);
                    }
                    continue;
                }
                const float *b[TILE];
                for (int t = 0; t < T; t++) b[t] = J + (j0 + t) * ld;
                DISPATCH(tile, T, a, b, c0, c1, d, s)
                for (int p = 0; p < T && i0 + p < m; p++)
                    for (int q = 0; q < T; q++) flush(acc + ((i0 + p) * m + j0 + q) * 2, s[p][q]);
            }
        }
    }
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j <= i; j++) {
            double t = lane_sum(acc + (i * m + j) * 2);
            for (int64_t k = n16; k < n; k++) {  /* the last n mod 16 columns */
                float x = J[i * ld + k], y = J[j * ld + k];
                if (d) { x *= d[k]; y *= d[k]; }
                t += (double)(x * y);
            }
            G[i * m + j] = G[j * m + i] = t;
        }
        if (v) {
            double t = lane_sum(vacc + i * 2);
            for (int64_t k = n16; k < n; k++) {
                float x = J[i * ld + k];
                if (d) x *= d[k];
                t += (double)(x * v[k]);
            }
            Jv[i] = t;
        }
    }
    free(acc);
    return 0;
}


/* R rows of J times v: acc[r][0..1] = lane sums of (double) J[r, k] * (double) v[k] */
#define ROWS 6
static inline __attribute__((always_inline)) void rows_matvec(const int R, const float *J, int64_t ld,
        int64_t n16, const float *v, vd acc[ROWS][2]) {
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (vd){0};
    for (int64_t k = 0; k < n16; k += LANES) {
        vf vk = load(v + k);
        vd vl = low(vk), vh = high(vk);
        for (int r = 0; r < R; r++) {
            vf x = load(J + r * ld + k);
            acc[r][0] += low(x) * vl;
            acc[r][1] += high(x) * vh;
        }
    }
}

/* out = J v from float64 products and sums, for float32 J (m rows of stride ld, n columns) and v */
void exact_matvec_f32(const float *J, int64_t m, int64_t ld, int64_t n, const float *v, double *out) {
    const int64_t n16 = n / LANES * LANES;
    for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
        const int R = m - i0 < ROWS ? (int)(m - i0) : ROWS;
        vd acc[ROWS][2];
        switch (R) {
            case 1: rows_matvec(1, J + i0 * ld, ld, n16, v, acc); break;
            case 2: rows_matvec(2, J + i0 * ld, ld, n16, v, acc); break;
            case 3: rows_matvec(3, J + i0 * ld, ld, n16, v, acc); break;
            case 4: rows_matvec(4, J + i0 * ld, ld, n16, v, acc); break;
            case 5: rows_matvec(5, J + i0 * ld, ld, n16, v, acc); break;
            default: rows_matvec(6, J + i0 * ld, ld, n16, v, acc); break;
        }
        for (int r = 0; r < R; r++) {
            double t[LANES];
            memcpy(t, &acc[r][0], sizeof acc[r][0]);
            memcpy(t + 8, &acc[r][1], sizeof acc[r][1]);
            for (int w = LANES / 2; w; w /= 2)
                for (int k = 0; k < w; k++) t[k] += t[k + w];
            double sum = t[0];
            for (int64_t k = n16; k < n; k++) sum += (double)J[(i0 + r) * ld + k] * (double)v[k];
            out[i0 + r] = sum;
        }
    }
}

/* acc[t] += sum over R rows r of (double) J[r, c0 + 8 t ...] * z[r], the rows in order */
#define CHUNK 1024
#define GROUP 5
static inline __attribute__((always_inline)) void rows_rmatvec(const int R, const float *J, int64_t ld,
        int64_t c0, int64_t width, const double *z, vd *acc) {
    const float *row[GROUP];
    double zr[GROUP];
    for (int r = 0; r < R; r++) { row[r] = J + r * ld + c0; zr[r] = z[r]; }
    for (int64_t t = 0; t < width; t += 2) {
        vd lo = acc[t], hi = acc[t + 1];
        for (int r = 0; r < R; r++) {
            vf x = load(row[r] + t * 8);
            lo += low(x) * zr[r];
            hi += high(x) * zr[r];
        }
        acc[t] = lo;
        acc[t + 1] = hi;
    }
}

/* out = J^T z (accumulate = 0) or out + J^T z (accumulate = 1) for float32 J and out and a float64 z:
   each entry summed in float64 (out first, then the rows in order) and rounded once */
void exact_rmatvec_f32(const float *J, int64_t m, int64_t ld, int64_t n, const double *z, float *out,
                       int accumulate) {
    const int64_t n16 = n / LANES * LANES;
    vd acc[CHUNK / 8];
    for (int64_t c0 = 0; c0 < n16; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < n16 ? c0 + CHUNK : n16, width = (c1 - c0) / 8;
        if (accumulate) {
            for (int64_t t = 0; t < width; t += 2) {
                vf o = load(out + c0 + t * 8);
                acc[t] = low(o);
                acc[t + 1] = high(o);
            }
        } else {
            for (int64_t t = 0; t < width; t++) acc[t] = (vd){0};
        }
        for (int64_t i0 = 0; i0 < m; i0 += GROUP) {
            const int R = m - i0 < GROUP ? (int)(m - i0) : GROUP;
            switch (R) {
                case 1: rows_rmatvec(1, J + i0 * ld, ld, c0, width, z + i0, acc); break;
                case 2: rows_rmatvec(2, J + i0 * ld, ld, c0, width, z + i0, acc); break;
                case 3: rows_rmatvec(3, J + i0 * ld, ld, c0, width, z + i0, acc); break;
                case 4: rows_rmatvec(4, J + i0 * ld, ld, c0, width, z + i0, acc); break;
                default: rows_rmatvec(5, J + i0 * ld, ld, c0, width, z + i0, acc); break;
            }
        }
        for (int64_t t = 0; t < width; t += 2) {
            vf r = join(acc[t], acc[t + 1]);
            memcpy(out + c0 + t * 8, &r, sizeof r);
        }
    }
    for (int64_t k = n16; k < n; k++) {
        double t = accumulate ? (double)out[k] : 0.0;
        for (int64_t i = 0; i < m; i++) t += (double)J[i * ld + k] * z[i];
        out[k] = (float)t;
    }
}
""".replace("@SPAN@", str(SPAN))

_FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-std=gnu11", "-shared", "-fPIC"]

_enabled = os.environ.get(NATIVE_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def set_native(enabled: bool) -> None:
    """Switch the native kernels on or off (process-wide; the eager path is the default)."""
    global _enabled
    _enabled = bool(enabled)


def native_enabled() -> bool:
    """Whether the native kernels are switched on (they may still be unavailable: :func:`available`)."""
    return _enabled


@contextlib.contextmanager
def native(enabled: bool = True) -> Iterator[None]:
    """The native kernels on (or off) inside the block."""
    previous = _enabled
    set_native(enabled)
    try:
        yield
    finally:
        set_native(previous)


def _takes_jacobian(J: Tensor, max_rows: int | None = None) -> bool:
    """Switched on, and J a float32 CPU matrix with unit column stride and at least one entry."""
    if not _enabled or J.device.type != "cpu" or J.dtype != torch.float32 or J.dim() != 2:
        return False
    m, n = J.shape
    return m >= 1 and n >= 1 and (max_rows is None or m <= max_rows) and (J.stride(1) == 1 or n == 1)


def _vector(t: Tensor | None, length: int, dtype: torch.dtype = torch.float32) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype == dtype and t.shape == (length,) and t.is_contiguous())


def takes_gram(J: Tensor, d: Tensor | None = None, v: Tensor | None = None) -> bool:
    """Whether :func:`gram` takes these operands (and the kernels compiled): a float32 CPU J with unit
    column stride and 1 <= m <= ``NATIVE_MAX_ROWS``; d and v contiguous float32 CPU n-vectors."""
    return (_takes_jacobian(J, NATIVE_MAX_ROWS) and _vector(d, J.shape[1]) and _vector(v, J.shape[1])
            and _library() is not None)


def takes_matvec(J: Tensor, v: Tensor) -> bool:
    """Whether :func:`exact_matvec` takes J and v (float32 CPU, v contiguous)."""
    return _takes_jacobian(J) and _vector(v, J.shape[1]) and _library() is not None


def takes_rmatvec(J: Tensor, z: Tensor, out: Tensor) -> bool:
    """Whether :func:`exact_rmatvec` takes J, a float64 z and a float32 n-vector ``out``."""
    return (_takes_jacobian(J) and _vector(z, J.shape[0], torch.float64) and _vector(out, J.shape[1])
            and _library() is not None)


def gram(J: Tensor, d: Tensor | None = None, v: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(G, J D v) as the module docstring says: G float64 (m, m), J D v float64 (m,) or None without v.
    Only where :func:`takes_gram` holds."""
    m, n = J.shape
    G = torch.empty(m, m, dtype=torch.float64)
    Jv = None if v is None else torch.empty(m, dtype=torch.float64)
    status = _library().gram_f32(
        J.data_ptr(), m, J.stride(0), n, None if d is None else d.data_ptr(),
        None if v is None else v.data_ptr(), G.data_ptr(), None if Jv is None else Jv.data_ptr(),
    )
    if status:
        raise MemoryError(f"The native Gram kernel could not allocate its {m} x {m} accumulators.")
    return G, Jv


def exact_matvec(J: Tensor, v: Tensor) -> Tensor:
    """J v (float64, (m,)) from float64 products and sums. Only where :func:`takes_matvec` holds."""
    m, n = J.shape
    out = torch.empty(m, dtype=torch.float64)
    _library().exact_matvec_f32(J.data_ptr(), m, J.stride(0), n, v.data_ptr(), out.data_ptr())
    return out


def exact_rmatvec(J: Tensor, z: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
    """out = J^T z (``accumulate``: out + J^T z) summed in float64 and rounded to float32 once. Only where
    :func:`takes_rmatvec` holds."""
    m, n = J.shape
    _library().exact_rmatvec_f32(J.data_ptr(), m, J.stride(0), n, z.data_ptr(), out.data_ptr(), int(accumulate))
    return out


def available() -> bool:
    """Whether the kernels compiled (and loaded) on this machine."""
    return _library() is not None


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernels (built once per source, compiler and CPU), or None where they cannot be built."""
    try:
        path = _build()
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError, RuntimeError) as error:
        warnings.warn(f"The native kernels are unavailable ({error}); the eager path is used.",
                      RuntimeWarning, stacklevel=3)
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.gram_f32.argtypes = [pointer, size, size, size, pointer, pointer, pointer, pointer]
    lib.gram_f32.restype = ctypes.c_int
    lib.exact_matvec_f32.argtypes = [pointer, size, size, size, pointer, pointer]
    lib.exact_matvec_f32.restype = None
    lib.exact_rmatvec_f32.argtypes = [pointer, size, size, size, pointer, pointer, ctypes.c_int]
    lib.exact_rmatvec_f32.restype = None
    return lib


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        raise RuntimeError("no C compiler found (set $CC)")
    return compiler


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (a library built for one CPU is never
    loaded on another)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text(errors="replace").splitlines()
        return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    return platform.processor() + platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "lit_constrained")
    return Path(root) / "native"


def _build() -> Path:
    """Compile the source into the cache (atomically: concurrent processes may build at once)."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(_FLAGS), compiler, version, _cpu_signature()]).encode())
    directory = _cache_dir()
    target = directory / f"kernels_{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        source = Path(scratch) / "kernels.c"
        source.write_text(_SOURCE)
        built = Path(scratch) / "kernels.so"
        result = subprocess.run([compiler, *_FLAGS, str(source), "-o", str(built)], capture_output=True,
                                text=True, timeout=120)
        if result.returncode:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:400]}")
        os.replace(built, target)
    return target
