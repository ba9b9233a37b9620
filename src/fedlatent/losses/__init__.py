"""Pure loss functions of tensors (no config, no I/O, no globals), tested against float64 references."""
from fedlatent.losses.contrastive import moon_contrastive, prototype_distance, proximal
from fedlatent.losses.decorrelation import decorrelation
from fedlatent.losses.decov import decov, structured_decov
from fedlatent.losses.mmd import mk_mmd, mmd_estimates, mmd_estimates_covariance, optimize_kernel_weights
from fedlatent.losses.mmd_d import DeepKernel, mmd_d, mmd_d_power, train_deep_kernel
from fedlatent.losses.uniformity import uniformity
from fedlatent.losses.variance import variance

__all__ = ["uniformity", "variance", "decorrelation", "decov", "structured_decov", "mk_mmd", "mmd_estimates", "mmd_estimates_covariance",
           "optimize_kernel_weights", "mmd_d", "mmd_d_power", "DeepKernel", "train_deep_kernel",
           "moon_contrastive", "proximal", "prototype_distance"]
