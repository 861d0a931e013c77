//! [`DataSpec`]: the `--data` argument.
//!
//! Accepted forms, exactly: `digits` (the embedded digits, split as in
//! [`digits_split`](super::digits_split)), `mnist5k` (the embedded real
//! MNIST subset, split as in [`mnist5k_split`](super::mnist5k_split)) and `mnist:<dir>` with a non-empty
//! `<dir>` (see [`load_mnist_dir`](super::load_mnist_dir)). Anything else is
//! a [`DataError::BadSpec`] listing these forms.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::dataset::Dataset;
use super::digits::digits_split;
use super::error::DataError;
use super::idx::load_mnist_dir;
use super::mnist5k::mnist5k_split;

/// Which data set to train and evaluate on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSpec {
    /// The embedded scikit-learn digits.
    Digits,
    /// The embedded 5000 real MNIST images (28x28).
    Mnist5k,
    /// MNIST IDX files in a directory.
    Mnist(PathBuf),
}

impl DataSpec {
    /// Parses `digits` or `mnist:<dir>`.
    pub fn parse(spec: &str) -> Result<Self, DataError> {
        let bad = |reason: &str| DataError::BadSpec { spec: spec.to_string(), reason: reason.to_string() };
        if spec == "digits" {
            return Ok(DataSpec::Digits);
        }
        if spec == "mnist5k" {
            return Ok(DataSpec::Mnist5k);
        }
        match spec.split_once(':') {
            Some(("mnist", "")) => Err(bad("the directory after `mnist:` is empty")),
            Some(("mnist", dir)) => Ok(DataSpec::Mnist(PathBuf::from(dir))),
            Some((kind, _)) => Err(bad(&format!("unknown data set `{kind}`"))),
            None if spec == "mnist" => Err(bad("`mnist` needs a directory: `mnist:<dir>`")),
            None => Err(bad("unknown data set")),
        }
    }

    /// Loads `(train, test)`.
    pub fn load(&self) -> Result<(Dataset, Dataset), DataError> {
        match self {
            DataSpec::Digits => digits_split(),
            DataSpec::Mnist5k => mnist5k_split(),
            DataSpec::Mnist(dir) => load_mnist_dir(dir),
        }
    }
}

impl FromStr for DataSpec {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataSpec::parse(s)
    }
}

impl fmt::Display for DataSpec {
    /// The form [`DataSpec::parse`] accepts (a non-UTF-8 path is shown lossily).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSpec::Digits => f.write_str("digits"),
            DataSpec::Mnist5k => f.write_str("mnist5k"),
            DataSpec::Mnist(dir) => write!(f, "mnist:{}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_accepted_forms() {
        assert_eq!(DataSpec::parse("digits").expect("ok"), DataSpec::Digits);
        assert_eq!(DataSpec::parse("mnist:/some/dir").expect("ok"), DataSpec::Mnist(PathBuf::from("/some/dir")));
        assert_eq!("mnist:rel/a:b".parse::<DataSpec>().expect("ok"), DataSpec::Mnist(PathBuf::from("rel/a:b")));
    }

    #[test]
    fn display_round_trips() {
        for s in ["digits", "mnist5k", "mnist:/x/y"] {
            assert_eq!(DataSpec::parse(s).expect("ok").to_string(), s);
        }
    }

    #[test]
    fn rejects_everything_else_listing_forms() {
        for s in ["", "Digits", "digits ", "mnist", "mnist:", "cifar:/x", "/x"] {
            let e = DataSpec::parse(s).expect_err(s);
            assert!(matches!(e, DataError::BadSpec { .. }), "{s}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains("`digits`") && msg.contains("`mnist:<dir>`"), "{msg}");
        }
    }

    #[test]
    fn loads_digits_and_reports_missing_mnist() {
        let (train, test) = DataSpec::Digits.load().expect("embedded");
        assert_eq!((train.len(), test.len()), (1437, 360));
        let dir = tempfile::tempdir().expect("temp dir");
        let e = DataSpec::Mnist(dir.path().to_path_buf()).load().expect_err("empty dir");
        assert!(matches!(e, DataError::MissingFile { .. }), "{e:?}");
    }
}
