//! How a variable gets its first value: [`Initializer`] with its options
//! ([`FanMode`], [`Distribution`]), and [`F32`], the bit-compared `f32`
//! attribute that keeps ops and initializers `Eq + Hash`. Pure data: the
//! draws themselves are `towers_kernels::init`'s.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An `f32` attribute that hashes and compares by bits, so ops stay `Eq + Hash`.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct F32(pub f32);

impl PartialEq for F32 {
    fn eq(&self, o: &F32) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}
impl Eq for F32 {}
impl std::hash::Hash for F32 {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}
impl fmt::Debug for F32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
impl fmt::Display for F32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How a variable gets its first value. Seeded initializers draw from a
/// stream keyed by (graph seed, variable name), so values do not depend on
/// creation order or thread count.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Initializer {
    Zeros,
    Ones,
    Constant(F32),
    TruncatedNormal {
        mean: F32,
        stddev: F32,
    },
    GlorotUniform,
    RandomUniform {
        min: F32,
        max: F32,
    },
    // initializers of issue 22
    /// TF's `variance_scaling_initializer(scale, mode, distribution)`:
    /// variance `scale / max(1, fan)`, fans from the shape (dense `[in, out]`,
    /// conv HWIO: receptive field `kh*kw`). He normal (`tf.keras.initializers.he_normal`)
    /// is [`Initializer::he_normal`].
    VarianceScaling {
        scale: F32,
        mode: FanMode,
        distribution: Distribution,
    },
    /// TF's `random_normal_initializer(mean, stddev)` (untruncated).
    RandomNormal {
        mean: F32,
        stddev: F32,
    },
}

impl Initializer {
    /// He (Kaiming) normal, as TF's `he_normal`: `VarianceScaling { scale: 2,
    /// FanIn, TruncatedNormal }`.
    pub fn he_normal() -> Initializer {
        Initializer::VarianceScaling {
            scale: F32(2.0),
            mode: FanMode::FanIn,
            distribution: Distribution::TruncatedNormal,
        }
    }
}

/// Which fan scales a variance-scaling initializer ([`Initializer::VarianceScaling`]) (TF's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FanMode {
    /// `fan_in` (He, LeCun).
    FanIn,
    /// `fan_out`.
    FanOut,
    /// `(fan_in + fan_out) / 2` (Glorot).
    FanAvg,
}

/// What a variance-scaling initializer ([`Initializer::VarianceScaling`]) draws from (TF's `distribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Distribution {
    /// A normal truncated at 2 stddev, its stddev divided by 0.87962566 so
    /// the draws have the wanted variance (TF's `"truncated_normal"`, and
    /// TF1's `"normal"`, its old name).
    TruncatedNormal,
    /// An untruncated normal (TF's `"untruncated_normal"`).
    Normal,
    /// `U(-limit, limit)`, `limit = sqrt(3 * scale)` (TF's `"uniform"`).
    Uniform,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_compares_by_bits() {
        assert_eq!(F32(f32::NAN), F32(f32::NAN));
        assert_ne!(F32(0.0), F32(-0.0));
        assert_eq!(F32(1.5).to_string(), "1.5");
    }

    #[test]
    fn he_normal_is_variance_scaling_fan_in() {
        let Initializer::VarianceScaling { scale, mode, distribution } = Initializer::he_normal() else {
            panic!("he_normal is a variance-scaling initializer")
        };
        assert_eq!((scale, mode, distribution), (F32(2.0), FanMode::FanIn, Distribution::TruncatedNormal));
        let j = serde_json::to_string(&Initializer::he_normal()).unwrap();
        assert_eq!(serde_json::from_str::<Initializer>(&j).unwrap(), Initializer::he_normal());
    }
}
