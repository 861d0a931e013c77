//! Every CUDA entry point the lowering launches, named once, beside the
//! family whose `.cu` defines it. The compile tests check each one exists
//! in its family's source.

/// An `extern "C" __global__` entry point of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// The family (folder under `kernels/src`) whose `.cu` defines it.
    pub family: &'static str,
    /// The entry point's name.
    pub name: &'static str,
}

macro_rules! entries {
    ($($c:ident = $family:literal :: $name:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` of `", $family, "`.")]
            pub const $c: Entry = Entry { family: $family, name: $name };
        )*
        /// Every entry point, in this file's order.
        pub const ALL: &[Entry] = &[$($c),*];
    };
}

entries! {
    BIAS_ACT_IN_PLACE = "elementwise"::"towers_bias_act_in_place_f32";
    BINARY = "elementwise"::"towers_binary_f32";
    BIAS_ADD = "elementwise"::"towers_bias_add_f32";
    BIAS_ADD_ACT = "elementwise"::"towers_bias_add_act_f32";
    UNARY = "elementwise"::"towers_unary_f32";
    UNARY_GRAD = "elementwise"::"towers_unary_grad_f32";
    BROADCAST_TO = "elementwise"::"towers_broadcast_to_f32";
    ADD_N = "misc"::"towers_add_n_f32";
    WEIGHTED_SUM = "misc"::"towers_weighted_sum_f32";
    FILL = "misc"::"towers_fill_f32";
    UNARY_GRAD_BIAS_GRAD = "reduce"::"towers_unary_grad_bias_grad_f32";
    UNARY_GRAD_BIAS_PARTIAL = "reduce"::"towers_unary_grad_bias_partial_f32";
    SUM_PARTIALS = "reduce"::"towers_sum_partials_f32";
    REDUCE = "reduce"::"towers_reduce_f32";
    L2_LOSS = "reduce"::"towers_l2_loss_f32";
    ARGMAX = "reduce"::"towers_argmax_f32";
    EQUAL_F32 = "reduce"::"towers_equal_f32";
    EQUAL_I32 = "reduce"::"towers_equal_i32";
    CAST_F32_I32 = "reduce"::"towers_cast_f32_i32";
    CAST_I32_F32 = "reduce"::"towers_cast_i32_f32";
    CAST_F32_BOOL = "reduce"::"towers_cast_f32_bool";
    CAST_I32_BOOL = "reduce"::"towers_cast_i32_bool";
    COPY_U32 = "reduce"::"towers_copy_u32";
    IM2COL = "conv"::"towers_im2col_f32";
    COL2IM = "conv"::"towers_col2im_f32";
    MAX_POOL = "pool"::"towers_max_pool_f32";
    AVG_POOL = "pool"::"towers_avg_pool_f32";
    MAX_POOL_GRAD = "pool"::"towers_max_pool_grad_f32";
    AVG_POOL_GRAD = "pool"::"towers_avg_pool_grad_f32";
    CONCAT_PART = "layout"::"towers_concat_part_f32";
    SPLIT_PART = "layout"::"towers_split_part_f32";
    SLICE = "layout"::"towers_slice_f32";
    SLICE_GRAD = "layout"::"towers_slice_grad_f32";
    SOFTMAX = "softmax"::"towers_softmax_f32";
    LOG_SOFTMAX = "softmax"::"towers_log_softmax_f32";
    SOFTMAX_GRAD = "softmax"::"towers_softmax_grad_f32";
    LOG_SOFTMAX_GRAD = "softmax"::"towers_log_softmax_grad_f32";
    SPARSE_SOFTMAX_XENT = "softmax"::"towers_sparse_softmax_xent_f32";
    SOFTMAX_XENT = "softmax"::"towers_softmax_xent_f32";
    DROPOUT = "dropout"::"towers_dropout_f32";
    BATCH_NORM_STATS = "batchnorm"::"towers_batch_norm_stats_f32";
    BATCH_NORM_APPLY = "batchnorm"::"towers_batch_norm_apply_f32";
    BATCH_NORM_INFER = "batchnorm"::"towers_batch_norm_infer_f32";
    BATCH_NORM_GRAD_REDUCE = "batchnorm"::"towers_batch_norm_grad_reduce_f32";
    BATCH_NORM_GRAD_DX = "batchnorm"::"towers_batch_norm_grad_dx_f32";
    ASSIGN_MOVING_AVERAGE = "optim"::"towers_assign_moving_average_f32";
    APPLY_GRADIENT_DESCENT = "optim"::"towers_apply_gradient_descent_f32";
    APPLY_MOMENTUM = "optim"::"towers_apply_momentum_f32";
    APPLY_ADAM = "optim"::"towers_apply_adam_f32";
    APPLY_RMSPROP = "optim"::"towers_apply_rmsprop_f32";
    APPLY_ADAGRAD = "optim"::"towers_apply_adagrad_f32";
    MEAN_APPLY_GRADIENT_DESCENT = "optim"::"towers_mean_apply_gradient_descent_f32";
    MEAN_APPLY_MOMENTUM = "optim"::"towers_mean_apply_momentum_f32";
    MEAN_APPLY_ADAM = "optim"::"towers_mean_apply_adam_f32";
    MEAN_APPLY_RMSPROP = "optim"::"towers_mean_apply_rmsprop_f32";
    MEAN_APPLY_ADAGRAD = "optim"::"towers_mean_apply_adagrad_f32";
    MULTI_APPLY_GRADIENT_DESCENT = "optim"::"towers_multi_apply_gradient_descent_f32";
    MULTI_APPLY_MOMENTUM = "optim"::"towers_multi_apply_momentum_f32";
    MULTI_APPLY_ADAM = "optim"::"towers_multi_apply_adam_f32";
    MULTI_APPLY_RMSPROP = "optim"::"towers_multi_apply_rmsprop_f32";
    MULTI_APPLY_ADAGRAD = "optim"::"towers_multi_apply_adagrad_f32";
    INCREMENT_STEP = "optim"::"towers_increment_step_i32";
    ONE_HOT = "array"::"towers_one_hot_f32";
    TRANSPOSE = "array"::"towers_transpose_f32";
    PAD = "array"::"towers_pad_f32";
    GATHER = "array"::"towers_gather_f32";
    GATHER_GRAD = "array"::"towers_gather_grad_f32";
    TILE = "array"::"towers_tile_f32";
    TILE_GRAD = "array"::"towers_tile_grad_f32";
}
