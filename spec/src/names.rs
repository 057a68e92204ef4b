//! Enums whose values are verl's spellings: `as_str`, `FromStr`, `Display`, serde and `ALL`.

/// A name that is not one of an enum's verl spellings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What was being named (`advantage estimator`).
    pub what: &'static str,
    pub name: String,
    /// The accepted spellings, comma-separated.
    pub expected: String,
}

impl std::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown {} `{}` (expected one of: {})",
            self.what, self.name, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}

/// Declares a name enum: `verl_names!(pub enum E ("what") { Variant => "spelling", .. })`.
macro_rules! verl_names {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident => $spelling:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $spelling)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// verl's spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $spelling),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($spelling => Ok($name::$variant),)+
                    _ => Err($crate::names::UnknownName {
                        what: $what,
                        name: s.to_owned(),
                        expected: [$($spelling),+].join(", "),
                    }),
                }
            }
        }
    };
}

pub(crate) use verl_names;
