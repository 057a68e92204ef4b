// collectives.h: differentiable collectives (Ulysses' and expert parallelism's all-to-all,
// the sequence gather), as autograd functions.
#include "boundary.h"
#include "collectives.h"
#include <torch/csrc/autograd/custom_function.h>

using namespace vlc;

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

vlc_pg* pg_of(AutogradContext* ctx) {
  return reinterpret_cast<vlc_pg*>(ctx->saved_data["pg"].toInt());
}

// `x` cut into `size` equal chunks along `scatter_dim`, chunk j sent to rank j, and the chunks
// received from every rank joined along `gather_dim` in rank order.
at::Tensor all_to_all(vlc_pg* pg, const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim) {
  auto input = at::stack(x.chunk(pg->size, scatter_dim), 0).contiguous();
  auto output = at::empty_like(input);
  std::vector<int64_t> equal;
  wait_work(pg, pg->backend->alltoall_base(output, input, equal, equal, c10d::AllToAllOptions()), 0);
  return at::cat(output.unbind(0), gather_dim);
}

// Ulysses' exchange between sequence shards and head shards; its gradient is the exchange back.
struct SequenceAllToAll : public torch::autograd::Function<SequenceAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg,
                            int64_t scatter_dim, int64_t gather_dim) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["scatter"] = scatter_dim;
    ctx->saved_data["gather"] = gather_dim;
    return all_to_all(reinterpret_cast<vlc_pg*>(pg), x, scatter_dim, gather_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = all_to_all(pg_of(ctx), grads[0].contiguous(), ctx->saved_data["gather"].toInt(),
                        ctx->saved_data["scatter"].toInt());
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Rows of `x` (dim 0) in blocks of `send[r]` rows to rank r; the blocks received, `recv[r]`
// rows from rank r, joined in rank order.
at::Tensor all_to_all_rows(vlc_pg* pg, const at::Tensor& x, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv) {
  int64_t rows = 0;
  for (auto n : recv) rows += n;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] = rows;
  auto input = x.contiguous();
  auto output = at::empty(shape, input.options());
  auto out_splits = recv;
  auto in_splits = send;
  wait_work(pg, pg->backend->alltoall_base(output, input, out_splits, in_splits,
                                           c10d::AllToAllOptions()), 0);
  return output;
}

// Expert parallelism's token exchange with uneven blocks; its gradient is the exchange back.
struct RowsAllToAll : public torch::autograd::Function<RowsAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg,
                            std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return all_to_all_rows(reinterpret_cast<vlc_pg*>(pg), x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto send = ctx->saved_data["send"].toIntVector();
    auto recv = ctx->saved_data["recv"].toIntVector();
    auto g = all_to_all_rows(pg_of(ctx), grads[0], recv, send);
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Every rank's `x` joined along `dim` in rank order. The gradient is this rank's slice of the
// incoming one: every rank computes the same function of the gathered tensor, so each keeps
// the part that flows back to its own input.
struct GatherSame : public torch::autograd::Function<GatherSame> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg, int64_t dim) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["dim"] = dim;
    auto* p = reinterpret_cast<vlc_pg*>(pg);
    auto input = x.contiguous().view({-1});
    auto output = at::empty({p->size * input.numel()}, input.options());
    wait_work(p, p->backend->_allgather_base(output, input, c10d::AllgatherOptions()), 0);
    std::vector<int64_t> shape{p->size};
    for (auto d : x.sizes()) shape.push_back(d);
    return at::cat(output.view(shape).unbind(0), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* p = pg_of(ctx);
    auto g = grads[0].chunk(p->size, ctx->saved_data["dim"].toInt())[p->backend->getRank()];
    return {g.contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// Differentiable Ulysses all-to-all of `x` over `pg` (see SequenceAllToAll); `*out` receives a
// new tensor the caller owns. The group must outlive the autograd graph.
char* vlc_sp_all_to_all(vlc_pg* pg, void* x, int64_t scatter_dim, int64_t gather_dim, void** out) {
  return guarded([&] {
    TORCH_CHECK(T(x).size(scatter_dim) % pg->size == 0, "all_to_all: dimension ", scatter_dim,
                " of size ", T(x).size(scatter_dim), " does not split over ", pg->size, " ranks");
    *out = new at::Tensor(
        SequenceAllToAll::apply(T(x), reinterpret_cast<int64_t>(pg), scatter_dim, gather_dim));
  });
}

// Differentiable exchange of row blocks (see RowsAllToAll): `n` counts per array; `*out` as
// in vlc_sp_all_to_all.
char* vlc_ep_all_to_all(vlc_pg* pg, void* x, const int64_t* send, const int64_t* recv, int64_t n,
                        void** out) {
  return guarded([&] {
    TORCH_CHECK(n == pg->size, "all_to_all: ", n, " blocks for ", pg->size, " ranks");
    std::vector<int64_t> s(send, send + n), r(recv, recv + n);
    int64_t total = 0;
    for (auto v : s) total += v;
    TORCH_CHECK(total == T(x).size(0), "all_to_all: blocks of ", total, " rows for ",
                T(x).size(0), " rows");
    *out = new at::Tensor(RowsAllToAll::apply(T(x), reinterpret_cast<int64_t>(pg), s, r));
  });
}

// Differentiable all-gather of `x` along `dim` (see GatherSame); `*out` as above.
char* vlc_sp_gather_same(vlc_pg* pg, void* x, int64_t dim, void** out) {
  return guarded([&] {
    *out = new at::Tensor(GatherSame::apply(T(x), reinterpret_cast<int64_t>(pg), dim));
  });
}

}  // extern "C"
