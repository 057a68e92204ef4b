// The chunked gated delta rule on CPU, forward and backward, one (batch row, key head) at a
// time with the value heads that read that key head.
//
// The tensor-op form (runtime/src/model/gated_deltanet.rs) runs every chunk of every head as a
// batch of small tensors: ~40 autograd nodes, each pass over (B, H, T, d) arrays written and
// read back, and MKL's triangular solves. Here each head's chunks stay in a few KiB of
// workspace: the chunk's matrices are recomputed in the backward (cheaper than storing them),
// only the state entering each chunk is kept, and the small products go to BLAS directly.
//
// Notation for one chunk of C tokens (rows), state S (d_k x d_v) entering it:
//   cum = cumsum(g), Gam[i][j] = exp(cum_i - cum_j) for j <= i (0 above),
//   Kb = beta * K, Vb = beta * V, Kbg = Kb * exp(cum) (row scalings),
//   A = strictly-lower(Kb K^T o Gam), T = (I + A)^-1, U = T Vb, W = T Kbg,
//   Vn = U - W S, Qg = Q * exp(cum), M = (Q K^T) o Gam, Kd = K * exp(cum_last - cum),
//   O = Qg S + M Vn,  S' = exp(cum_last) S + Kd^T Vn.
#include "kernels.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

// MKL's (and any reference BLAS's) Fortran entry point, exported by libtorch_cpu. Weak: a
// libtorch without it leaves this null and `have_blas` false.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) __attribute__((weak));
// MKL's per-thread thread count (its C entry point; the lower-case names are the Fortran ones,
// which take a pointer); absent from other BLAS builds.
extern "C" int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));

namespace vlc_kernels {

bool have_blas() {
  return sgemm_ != nullptr;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Row-major C (m x n) = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n; ld* are row
// strides. BLAS is column-major, where a row-major matrix reads as its transpose, so this is
// C^T = op(B)^T op(A)^T there.
void mm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
        const float* b, int ldb, float beta, float* c, int ldc) {
  const char* opb = tb ? "T" : "N";
  const char* opa = ta ? "T" : "N";
  sgemm_(opb, opa, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// For its lifetime, BLAS calls on this thread run on this thread alone: the kernels call it
// from inside a parallel loop over heads, where MKL would otherwise start a team of its own
// per product (nested OpenMP, threads spinning at its barriers).
struct SerialBlas {
  int previous = 0;
  SerialBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) previous = MKL_Set_Num_Threads_Local(1);
  }
  ~SerialBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);
  }
};

constexpr float kL2Eps = 1e-6f;

struct Dims {
  int64_t c, dk, dv;
};

// One chunk's derived matrices (the notation above), recomputed from its inputs and the
// state entering it. Products that share an operand are stacked so that one BLAS call
// computes them: `kbq` = [Kb; Q] (2C x d_k), `pm` = [A; M] (2C x C), `rhs` = [Vb | Kbg] and
// `x` = T rhs = [U | W] (C x (d_v + d_k)).
struct Chunk {
  int64_t c, dk, dv;
  std::vector<float> cum, ecum, edecay, kbq, gam, pm, t, rhs, x, vn, qg, kd;
  float cl = 0.f, ecl = 1.f;

  explicit Chunk(const Dims& d)
      : c(d.c), dk(d.dk), dv(d.dv), cum(c), ecum(c), edecay(c), kbq(2 * c * dk),
        gam(c * c), pm(2 * c * c), t(c * c), rhs(c * (dv + dk)), x(c * (dv + dk)), vn(c * dv),
        qg(c * dk), kd(c * dk) {}

  const float* a() const { return pm.data(); }
  const float* m() const { return pm.data() + c * c; }
  const float* kb() const { return kbq.data(); }
  const float* u() const { return x.data(); }
  const float* w() const { return x.data() + dv; }
  // Row r of Kbg, the right part of `rhs`.
  const float* kbg(int r) const { return rhs.data() + r * (dv + dk) + dv; }

  VLC_VECTOR_CLONES void compute(const float* q, const float* k, const float* v, const float* g,
               const float* beta, const float* s) {
    const int C = c, K = dk, V = dv, LX = dv + dk;
    float acc = 0.f;
    for (int i = 0; i < C; ++i) {
      acc += g[i];
      cum[i] = acc;
      ecum[i] = std::exp(acc);
    }
    cl = cum[C - 1];
    ecl = std::exp(cl);
    for (int i = 0; i < C; ++i) edecay[i] = std::exp(cl - cum[i]);
    // Gam row i is row i - 1 decayed by exp(g_i), then 1 on the diagonal: a product of the
    // decays after j up to i, so no exp per entry and underflow goes smoothly to zero.
    std::fill(gam.begin(), gam.end(), 0.f);
    gam[0] = 1.f;
    for (int i = 1; i < C; ++i) {
      const float e = std::exp(g[i]);
      const float* prev = &gam[(i - 1) * C];
      float* row = &gam[i * C];
      for (int j = 0; j < i; ++j) row[j] = prev[j] * e;
      row[i] = 1.f;
    }
    float* kb = kbq.data();
    for (int i = 0; i < C; ++i) {
      const float bi = beta[i], ei = ecum[i], di = edecay[i];
      for (int j = 0; j < K; ++j) {
        const float kij = k[i * K + j];
        kb[i * K + j] = bi * kij;
        rhs[i * LX + V + j] = bi * kij * ei;
        qg[i * K + j] = q[i * K + j] * ei;
        kd[i * K + j] = kij * di;
      }
      for (int j = 0; j < V; ++j) rhs[i * LX + j] = bi * v[i * V + j];
    }
    std::copy(q, q + C * K, kbq.begin() + C * K);
    // [A; M] = [Kb; Q] K^T, then masked: A strictly lower, M lower, both times Gam.
    mm(false, true, 2 * C, C, K, 1.f, kbq.data(), K, k, K, 0.f, pm.data(), C);
    float* a = pm.data();
    float* mq = pm.data() + C * C;
    for (int i = 0; i < C; ++i) {
      for (int j = 0; j < C; ++j) {
        a[i * C + j] = j < i ? a[i * C + j] * gam[i * C + j] : 0.f;
        mq[i * C + j] *= gam[i * C + j];
      }
    }
    // T = (I + A)^-1 by rows: T[i] = e_i - sum_{l<i} A[i][l] T[l] (row l is zero past l).
    std::fill(t.begin(), t.end(), 0.f);
    for (int i = 0; i < C; ++i) {
      float* ti = &t[i * C];
      ti[i] = 1.f;
      for (int l = 0; l < i; ++l) {
        const float al = a[i * C + l];
        const float* tl = &t[l * C];
        for (int j = 0; j <= l; ++j) ti[j] -= al * tl[j];
      }
    }
    mm(false, false, C, LX, C, 1.f, t.data(), C, rhs.data(), LX, 0.f, x.data(), LX);
    for (int i = 0; i < C; ++i) std::copy(&x[i * LX], &x[i * LX] + V, &vn[i * V]);
    mm(false, false, C, V, K, -1.f, w(), LX, s, V, 1.f, vn.data(), V);
  }
};

// A (B, T, H, d) tensor's rows (the last dimension contiguous).
struct Rows4 {
  float* p;
  int64_t sb, st, sh;
  float* at(int64_t b, int64_t t, int64_t h) const { return p + b * sb + t * st + h * sh; }
};

// A (B, T, H) tensor's entries.
struct Rows3 {
  float* p;
  int64_t sb, st, sh;
  float& at(int64_t b, int64_t t, int64_t h) const { return p[b * sb + t * st + h * sh]; }
};

Rows4 rows4(const at::Tensor& x) {
  return Rows4{x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)};
}

Rows3 rows3(const at::Tensor& x) {
  return Rows3{x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)};
}

// The problem's shapes and inputs; a unit of work is one (batch row, key head) pair with
// the value heads that read that key head.
struct Problem {
  Rows4 q, k, v;
  Rows3 g, beta;
  int64_t batch, len, key_heads, value_heads, chunks;
  Dims d;
  float scale;

  int64_t rep() const { return value_heads / key_heads; }
  int64_t padded() const { return chunks * d.c; }
  int64_t units() const { return batch * key_heads; }
  // Index of state (b, h, chunk) in a (B, H_v, N, d_k, d_v) array.
  int64_t state_at(int64_t b, int64_t h, int64_t i) const {
    return ((b * value_heads + h) * chunks + i) * d.dk * d.dv;
  }
};

Problem problem_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& g, const at::Tensor& beta, int64_t chunk, double scale) {
  const int64_t len = q.size(1);
  return Problem{rows4(q), rows4(k), rows4(v), rows3(g), rows3(beta),
                 q.size(0), len, q.size(2), v.size(2), (len + chunk - 1) / chunk,
                 Dims{chunk, q.size(3), v.size(3)}, static_cast<float>(scale)};
}

// Queries and keys of unit (b, kh), L2-normalised (queries also scaled) into (T', d_k)
// arrays with zero rows past the end; `rq`, `rk` keep the inverse norms.
VLC_VECTOR_CLONES void normalised(const Problem& pr, int64_t b, int64_t kh, std::vector<float>& qn,
                std::vector<float>& kn, std::vector<float>& rq, std::vector<float>& rk) {
  const int64_t K = pr.d.dk;
  std::fill(qn.begin(), qn.end(), 0.f);
  std::fill(kn.begin(), kn.end(), 0.f);
  for (int64_t t = 0; t < pr.len; ++t) {
    const float* q = pr.q.at(b, t, kh);
    const float* k = pr.k.at(b, t, kh);
    rq[t] = 1.f / std::sqrt(dot(q, q, K) + kL2Eps);
    rk[t] = 1.f / std::sqrt(dot(k, k, K) + kL2Eps);
    const float sq = rq[t] * pr.scale;
    for (int64_t j = 0; j < K; ++j) {
      qn[t * K + j] = q[j] * sq;
      kn[t * K + j] = k[j] * rk[t];
    }
  }
}

// Chunk i of value head h's values, decays and betas, zero past the end.
void gather(const Problem& pr, int64_t b, int64_t h, int64_t i, float* v, float* g,
            float* beta) {
  const int64_t C = pr.d.c, V = pr.d.dv;
  for (int64_t r = 0; r < C; ++r) {
    const int64_t t = i * C + r;
    if (t < pr.len) {
      std::copy(pr.v.at(b, t, h), pr.v.at(b, t, h) + V, v + r * V);
      g[r] = pr.g.at(b, t, h);
      beta[r] = pr.beta.at(b, t, h);
    } else {
      std::fill(v + r * V, v + (r + 1) * V, 0.f);
      g[r] = 0.f;
      beta[r] = 0.f;
    }
  }
}

// Forward of units [begin, end): `out` (B, T, H_v, d_v), the final states and the state
// entering each chunk.
VLC_VECTOR_CLONES void forward_units(const Problem& pr, const float* initial, const Rows4& out, float* last,
                   float* states, int64_t begin, int64_t end) {
  const Dims& d = pr.d;
  const int C = d.c, K = d.dk, V = d.dv;
  SerialBlas serial;
  Chunk ch(d);
  const int64_t tp = pr.padded();
  std::vector<float> qn(tp * K), kn(tp * K), rq(tp), rk(tp), s(K * V), v(C * V), g(C),
      beta(C), o(C * V);
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b = u / pr.key_heads, kh = u % pr.key_heads;
    normalised(pr, b, kh, qn, kn, rq, rk);
    for (int64_t h = kh * pr.rep(); h < (kh + 1) * pr.rep(); ++h) {
      const int64_t bh = b * pr.value_heads + h;
      std::copy(initial + bh * K * V, initial + (bh + 1) * K * V, s.begin());
      for (int64_t i = 0; i < pr.chunks; ++i) {
        std::copy(s.begin(), s.end(), states + pr.state_at(b, h, i));
        gather(pr, b, h, i, v.data(), g.data(), beta.data());
        const float* q = &qn[i * C * K];
        ch.compute(q, &kn[i * C * K], v.data(), g.data(), beta.data(), s.data());
        mm(false, false, C, V, K, 1.f, ch.qg.data(), K, s.data(), V, 0.f, o.data(), V);
        mm(false, false, C, V, C, 1.f, ch.m(), C, ch.vn.data(), V, 1.f, o.data(), V);
        for (int64_t r = 0; r < C && i * C + r < pr.len; ++r) {
          std::copy(&o[r * V], &o[(r + 1) * V], out.at(b, i * C + r, h));
        }
        for (auto& e : s) e *= ch.ecl;
        mm(true, false, K, V, C, 1.f, ch.kd.data(), K, ch.vn.data(), V, 1.f, s.data(), V);
      }
      std::copy(s.begin(), s.end(), last + bh * K * V);
    }
  }
}

struct Grads {
  Rows4 q, k, v;
  Rows3 g, beta;
  float* initial;
};

// Backward of units [begin, end), chunks in reverse; `dout` (B, T, H_v, d_v) and `dlast`
// (B, H_v, d_k, d_v) are the incoming gradients (`dlast` may be null: zero).
VLC_VECTOR_CLONES void backward_units(const Problem& pr, const float* states, const Rows4& dout,
                    const float* dlast, const Grads& gr, int64_t begin, int64_t end) {
  const Dims& d = pr.d;
  const int C = d.c, K = d.dk, V = d.dv, LX = d.dv + d.dk;
  SerialBlas serial;
  Chunk ch(d);
  const int64_t tp = pr.padded();
  std::vector<float> qn(tp * K), kn(tp * K), rq(tp), rk(tp), dqn(tp * K), dkn(tp * K),
      v(C * V), g(C), beta(C), d_o(C * V), ds(K * V), dsp(K * V), dx(C * LX), dr(C * LX),
      dqg(C * K), dm(C * C), dkd(C * K), da(C * C), dpq(2 * C * C), acc(2 * C * K),
      gsum(C * C), dcum(C), colsum(C), ones(C, 1.f);
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b = u / pr.key_heads, kh = u % pr.key_heads;
    normalised(pr, b, kh, qn, kn, rq, rk);
    std::fill(dqn.begin(), dqn.end(), 0.f);
    std::fill(dkn.begin(), dkn.end(), 0.f);
    for (int64_t h = kh * pr.rep(); h < (kh + 1) * pr.rep(); ++h) {
      const int64_t bh = b * pr.value_heads + h;
      if (dlast != nullptr) {
        std::copy(dlast + bh * K * V, dlast + (bh + 1) * K * V, ds.begin());
      } else {
        std::fill(ds.begin(), ds.end(), 0.f);
      }
      for (int64_t i = pr.chunks - 1; i >= 0; --i) {
        const float* s = states + pr.state_at(b, h, i);
        gather(pr, b, h, i, v.data(), g.data(), beta.data());
        const float *q = &qn[i * C * K], *k = &kn[i * C * K];
        ch.compute(q, k, v.data(), g.data(), beta.data(), s);
        for (int r = 0; r < C; ++r) {
          const int64_t t = i * C + r;
          if (t < pr.len) {
            std::copy(dout.at(b, t, h), dout.at(b, t, h) + V, &d_o[r * V]);
          } else {
            std::fill(&d_o[r * V], &d_o[(r + 1) * V], 0.f);
          }
        }
        const float* dO = d_o.data();
        float* dq = &dqn[i * C * K];
        float* dk = &dkn[i * C * K];
        // Through O = Qg S + M Vn and S' = exp(cl) S + Kd^T Vn; dx = [dVn | dW].
        mm(true, false, C, V, C, 1.f, ch.m(), C, dO, V, 0.f, dx.data(), LX);
        mm(false, false, C, V, K, 1.f, ch.kd.data(), K, ds.data(), V, 1.f, dx.data(), LX);
        mm(false, true, C, K, V, 1.f, dO, V, s, V, 0.f, dqg.data(), K);
        mm(false, true, C, C, V, 1.f, dO, V, ch.vn.data(), V, 0.f, dm.data(), C);
        mm(false, true, C, K, V, 1.f, ch.vn.data(), V, ds.data(), V, 0.f, dkd.data(), K);
        const float dcl =
            ch.ecl * dot(s, ds.data(), K * V) + dot(dkd.data(), ch.kd.data(), C * K);
        // The state's gradient entering this chunk (Vn = U - W S reads S too).
        mm(true, false, K, V, C, 1.f, ch.qg.data(), K, dO, V, 0.f, dsp.data(), V);
        for (int j = 0; j < K * V; ++j) dsp[j] += ch.ecl * ds[j];
        mm(true, false, K, V, C, -1.f, ch.w(), LX, dx.data(), LX, 1.f, dsp.data(), V);
        // Through [U | W] = T [Vb | Kbg]: dW = -dVn S^T; [dVb | dKbg] = T^T [dVn | dW];
        // dA = -[dVb | dKbg] [U | W]^T.
        mm(false, true, C, K, V, -1.f, dx.data(), LX, s, V, 0.f, dx.data() + V, LX);
        mm(true, false, C, LX, C, 1.f, ch.t.data(), C, dx.data(), LX, 0.f, dr.data(), LX);
        mm(false, true, C, C, LX, -1.f, dr.data(), LX, ch.x.data(), LX, 0.f, da.data(), C);
        // Through the masks: dpq = [dP; dQK] = [dA o Gam (strictly lower); dM o Gam]; gsum
        // holds dGam o Gam, whose row sums minus column sums feed the cumulative decays.
        const float* a = ch.a();
        const float* mq = ch.m();
        for (int r = 0; r < C; ++r) {
          for (int c = 0; c < C; ++c) {
            const int e = r * C + c;
            const bool strict = c < r, incl = c <= r;
            dpq[e] = strict ? da[e] * ch.gam[e] : 0.f;
            dpq[C * C + e] = incl ? dm[e] * ch.gam[e] : 0.f;
            gsum[e] = (strict ? da[e] * a[e] : 0.f) + (incl ? dm[e] * mq[e] : 0.f);
          }
        }
        // acc = [dKb; dQ'] = [dKbg exp(cum); dQg exp(cum)] + dpq K.
        for (int r = 0; r < C; ++r) {
          const float e = ch.ecum[r], de = ch.edecay[r];
          for (int j = 0; j < K; ++j) {
            acc[r * K + j] = dr[r * LX + V + j] * e;
            acc[(C + r) * K + j] = dqg[r * K + j] * e;
            dk[r * K + j] += dkd[r * K + j] * de;
          }
        }
        mm(false, false, 2 * C, K, C, 1.f, dpq.data(), C, k, K, 1.f, acc.data(), K);
        // dK += [dP; dQK]^T [Kb; Q] + beta dKb.
        mm(true, false, C, K, 2 * C, 1.f, dpq.data(), C, ch.kbq.data(), K, 1.f, dk, K);
        const float* dkb = acc.data();
        for (int r = 0; r < C; ++r) {
          const float br = beta[r];
          for (int j = 0; j < K; ++j) {
            dk[r * K + j] += br * dkb[r * K + j];
            dq[r * K + j] += acc[(C + r) * K + j];
          }
        }
        for (int r = 0; r < C; ++r) {
          dcum[r] = dot(&dqg[r * K], &ch.qg[r * K], K) - dot(&dkd[r * K], &ch.kd[r * K], K) +
                    dot(&dr[r * LX + V], ch.kbg(r), K);
        }
        // Row sums minus column sums of gsum (zero above the diagonal; the diagonal cancels).
        std::fill(colsum.begin(), colsum.end(), 0.f);
        for (int r = 0; r < C; ++r) {
          dcum[r] += dot(&gsum[r * C], ones.data(), C);
          for (int c = 0; c < C; ++c) colsum[c] += gsum[r * C + c];
        }
        for (int c = 0; c < C; ++c) dcum[c] -= colsum[c];
        dcum[C - 1] += dcl;
        // Per token: dV = beta dVb, dbeta = dKb . K + dVb . V, dg = reversed cumsum of dcum.
        float total = 0.f;
        for (int r = C - 1; r >= 0; --r) {
          total += dcum[r];
          const int64_t t = i * C + r;
          if (t >= pr.len) continue;
          const float* dvb = &dr[r * LX];
          float* dv = gr.v.at(b, t, h);
          for (int j = 0; j < V; ++j) dv[j] = beta[r] * dvb[j];
          gr.beta.at(b, t, h) = dot(&dkb[r * K], &k[r * K], K) + dot(dvb, &v[r * V], V);
          gr.g.at(b, t, h) = total;
        }
        std::swap(ds, dsp);
      }
      std::copy(ds.begin(), ds.end(), gr.initial + bh * K * V);
    }
    // Through the normalisation: x_n = c x r with r = (|x|^2 + eps)^-1/2 gives
    // dx = c (r dx_n - x r^3 (x . dx_n)).
    for (int64_t t = 0; t < pr.len; ++t) {
      const float* q = pr.q.at(b, t, kh);
      const float* k = pr.k.at(b, t, kh);
      const float rq3 = rq[t] * rq[t] * rq[t], rk3 = rk[t] * rk[t] * rk[t];
      const float pq = dot(q, &dqn[t * K], K), pk = dot(k, &dkn[t * K], K);
      float* gq = gr.q.at(b, t, kh);
      float* gk = gr.k.at(b, t, kh);
      for (int j = 0; j < K; ++j) {
        gq[j] = pr.scale * (rq[t] * dqn[t * K + j] - q[j] * rq3 * pq);
        gk[j] = rk[t] * dkn[t * K + j] - k[j] * rk3 * pk;
      }
    }
  }
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial,
                  int64_t chunk) {
  TORCH_CHECK(have_blas(), "chunk_gated_delta_rule: this libtorch exports no sgemm_");
  for (const at::Tensor* x : {&q, &k, &v, &g, &beta, &initial}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat,
                "chunk_gated_delta_rule: inputs must be f32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && g.dim() == 3 &&
                  beta.sizes() == g.sizes() && initial.dim() == 4,
              "chunk_gated_delta_rule: inputs of the wrong rank");
  const int64_t b = q.size(0), t = q.size(1), hk = q.size(2), hv = v.size(2);
  TORCH_CHECK(v.size(0) == b && v.size(1) == t && hv % hk == 0 &&
                  g.sizes() == at::IntArrayRef({b, t, hv}) &&
                  initial.sizes() == at::IntArrayRef({b, hv, q.size(3), v.size(3)}),
              "chunk_gated_delta_rule: mismatched shapes");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 &&
                  initial.is_contiguous(),
              "chunk_gated_delta_rule: rows must be contiguous");
  TORCH_CHECK(chunk > 0, "chunk_gated_delta_rule: chunk ", chunk);
}

struct ChunkGatedDeltaRule : public torch::autograd::Function<ChunkGatedDeltaRule> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                               const at::Tensor& initial, int64_t chunk, double scale) {
    const Problem pr = problem_of(q, k, v, g, beta, chunk, scale);
    const int64_t B = pr.batch, H = pr.value_heads;
    auto out = at::empty({B, pr.len, H, pr.d.dv}, v.options());
    auto last = at::empty({B, H, pr.d.dk, pr.d.dv}, v.options());
    auto states = at::empty({B, H, pr.chunks, pr.d.dk, pr.d.dv}, v.options());
    const float* init = initial.data_ptr<float>();
    const Rows4 o = rows4(out);
    float *l = last.data_ptr<float>(), *st = states.data_ptr<float>();
    parallel_ranges(pr.units(), 1, [&](int64_t begin, int64_t end) {
      forward_units(pr, init, o, l, st, begin, end);
    });
    ctx->save_for_backward({q, k, v, g, beta});
    ctx->saved_data["states"] = states;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["scale"] = scale;
    return {out, last};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4];
    const auto states = ctx->saved_data["states"].toTensor();
    const Problem pr = problem_of(q, k, v, g, beta, ctx->saved_data["chunk"].toInt(),
                                  ctx->saved_data["scale"].toDouble());
    const int64_t B = pr.batch, H = pr.value_heads;
    auto dout = grads[0].defined() ? grads[0].to(at::kFloat).contiguous()
                                   : at::zeros({B, pr.len, H, pr.d.dv}, v.options());
    at::Tensor dlast;
    if (grads[1].defined()) dlast = grads[1].to(at::kFloat).contiguous();
    auto dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
         dv = at::empty(v.sizes(), v.options()), dg = at::empty(g.sizes(), g.options()),
         dbeta = at::empty(beta.sizes(), beta.options()),
         dinit = at::empty({B, H, pr.d.dk, pr.d.dv}, v.options());
    const Grads gr{rows4(dq), rows4(dk), rows4(dv), rows3(dg), rows3(dbeta),
                   dinit.data_ptr<float>()};
    const float* st = states.data_ptr<float>();
    const Rows4 d_out = rows4(dout);
    const float* d_last = dlast.defined() ? dlast.data_ptr<float>() : nullptr;
    parallel_ranges(pr.units(), 1, [&](int64_t begin, int64_t end) {
      backward_units(pr, st, d_out, d_last, gr, begin, end);
    });
    return {dq, dk, dv, dg, dbeta, dinit, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& g,
                                               const at::Tensor& beta, const at::Tensor& initial,
                                               int64_t chunk, double scale) {
  check_inputs(q, k, v, g, beta, initial, chunk);
  return ChunkGatedDeltaRule::apply(q, k, v, g, beta, initial, chunk, scale);
}

}  // namespace vlc_kernels
