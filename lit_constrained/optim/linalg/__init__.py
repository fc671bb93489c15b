r"""Rank-revealing null-space linear algebra for a constraint Jacobian J (m x n, m small, n large).

J and every n-vector stay in their own dtype (float32 for float32 parameters); float64 is used for the
m x m algebra and for the accumulations that need it:

* the Gram matrix :math:`G = J J^T` (:func:`gram`): for float32 J, float32 products over column blocks
  of ``GRAM_BLOCK`` columns, the blocks summed in float64 (relative error ~ :math:`\epsilon_{32}
  \sqrt{B/n}`, :func:`gram_error`; one float32 GEMM over all n would give ~:math:`\epsilon_{32}\sqrt n`);
  :func:`exact_gram` forms it from float64 products when J is too ill-conditioned for that;
* :math:`J v` (:func:`matvec`) is a float32 product; :func:`exact_matvec` forms it from float64
  products (J converted chunk by chunk) for the residuals of iterative refinement; :math:`J^T z`
  (:func:`add_rmatvec_`) is an n-vector written in J's dtype (a refinement's correction formed apart
  and then added, :func:`refine_`);
* a column-scaled operator :math:`J D`, D = diag(d) (Adam(con)'s :math:`J H^{-1/2}`), is never formed
  (``scaling``): its Gram :math:`J D^2 J^T` scales a cache-sized chunk of columns at a time
  (:func:`scaled_gram`), its products are :math:`J (d \odot v)` and :math:`d \odot (J^T z)`.

With :math:`G = U \Lambda U^T` (an eigendecomposition: the left singular vectors and squared singular
values of J), the numerical rank keeps the eigenvalues with :math:`\lambda_i > \mathrm{rcond}^2
\lambda_{\max}` (a relative cutoff on the singular values, never an absolute shift) and
:math:`G^+ = U \mathrm{diag}(\mathrm{keep}/\lambda) U^T` (:class:`GramFactor`; the cutoff is a mask, so
no host sync and no data-dependent shapes). Then

.. math::
    P w = w - J^T G^+ J w, \qquad J^+ c = J^T G^+ c,

P the orthogonal projector on the numerical null space of J and :math:`J^+ c` the minimum-norm
least-squares solution of :math:`J x = c`. The optimizers need both at once and merge them by linearity
(:func:`merged_step`): one pass for :math:`J w`, one for :math:`J^T z`,

.. math::
    \delta = a P w - J^+ (s c) = a w - J^T z, \qquad z = G^+ (s c + a J w).

Iterative refinement (residual :math:`-s\,U_r U_r^T c - J \delta`, correction :math:`J^T G^+ r`, two
passes over J) removes the errors of the first pass: that of the normal
equations (each step multiplies it by about :math:`q = \kappa(G)\,\epsilon_G`, :math:`\epsilon_G` the
Gram's relative error) and, for float32 J, the cancellation in :math:`J^T z` (:math:`z` grows like
:math:`1/\sigma_{\min}^2` while :math:`J^T z` like :math:`1/\sigma_{\min}`: a relative error
:math:`\sim\epsilon_{32}\,\kappa(J)`). :class:`RefinementPlan` holds the number of steps, or the exact
float64 Gram when the blocked one is too inaccurate for the conditioning of J. The residual is what
limits the refined accuracy: :func:`blocked_matvec` (float32 products over ``RESIDUAL_BLOCK`` columns
summed in float64, the cost of one float32 pass) is accurate to about :math:`\epsilon_{32}
\sqrt{B/n}\,\kappa(J)` relative to :math:`\|s c\|`, and :func:`exact_matvec` (float64 products, ~3-6
float32 passes' time: the conversion of J dominates) to the float32 rounding of :math:`\delta` itself;
:func:`exact_residual_needed` picks the exact one only where the blocked one cannot reach
``TARGET_ERROR`` (and always on the exact-Gram path).

One concept per module: the Gram (:mod:`.gram`; its CPU products by SciPy's BLAS, :mod:`.host_gram`;
m x m symmetrization, :mod:`.symmetric`), the products with J (:mod:`.products`), the factor of G and its
rank cutoff (:mod:`.gram_factor`: ``eigh``, or LAPACK's pivoted Cholesky for a large CPU Gram,
:mod:`.pivoted_cholesky`), the refinement (:mod:`.refinement`: :class:`RefinementPlan`, :func:`refine_`),
the merged step (:mod:`.merged_step`), the factorization object of the public API (:mod:`.nullspace`:
:class:`NullSpace`) and the host BLAS threads around a step (:mod:`.blas_threads`). Eager torch only:
hand-written C and ``torch.compile`` of its passes were measured slower (docs/optim_measurements.md).
"""
