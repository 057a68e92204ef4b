//! Typed values straight from the composed tree: a serde `Deserializer` over [`Node`].
//!
//! `verlc check` types the whole config (`VerlConfig`, about a thousand values) on every run;
//! going through `serde_json::Value` first built and dropped a second copy of the tree. This
//! reads the tree as `serde_json::from_value(node.to_json())` would, value for value and error
//! for error (its error type is `serde_json::Error`, and the test below holds the two equal on
//! broken configs), without the copy.

use std::borrow::Cow;

use serde::de::value::StrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, Unexpected, VariantAccess, Visitor,
};
use serde_json::Error;

use super::node::{Entry, Node, Scalar, Value, format_float};

/// `T` from the tree, as `serde_json::from_value(node.to_json())` gives it.
pub fn from_node<T: DeserializeOwned>(node: &Node) -> Result<T, Error> {
    T::deserialize(NodeDeserializer(node))
}

struct NodeDeserializer<'a>(&'a Node);

impl NodeDeserializer<'_> {
    /// What serde's "invalid type" errors name the value as (serde_json's words for JSON's).
    fn unexpected(&self) -> Unexpected<'_> {
        match &self.0.value {
            Value::Scalar(Scalar::Null) => Unexpected::Unit,
            Value::Scalar(Scalar::Bool(b)) => Unexpected::Bool(*b),
            Value::Scalar(Scalar::Int(i)) if *i >= 0 => Unexpected::Unsigned(*i as u64),
            Value::Scalar(Scalar::Int(i)) => Unexpected::Signed(*i),
            Value::Scalar(Scalar::Float(f)) if f.is_finite() => Unexpected::Float(*f),
            // `to_json` writes a non-finite float as its YAML spelling, a string.
            Value::Scalar(Scalar::Float(_)) => Unexpected::Other("string"),
            Value::Scalar(Scalar::Str(s)) => Unexpected::Str(s),
            Value::Seq(_) => Unexpected::Seq,
            Value::Map(_) => Unexpected::Map,
        }
    }
}

impl<'de> Deserializer<'de> for NodeDeserializer<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Scalar(Scalar::Null) => visitor.visit_unit(),
            Value::Scalar(Scalar::Bool(b)) => visitor.visit_bool(*b),
            // JSON keeps non-negative integers unsigned: visitors see what they saw there.
            Value::Scalar(Scalar::Int(i)) if *i >= 0 => visitor.visit_u64(*i as u64),
            Value::Scalar(Scalar::Int(i)) => visitor.visit_i64(*i),
            Value::Scalar(Scalar::Float(f)) if f.is_finite() => visitor.visit_f64(*f),
            Value::Scalar(Scalar::Float(f)) => visitor.visit_string(format_float(*f)),
            Value::Scalar(Scalar::Str(s)) => visitor.visit_str(s),
            Value::Seq(items) => {
                let mut seq = Items { iter: items.iter() };
                let out = visitor.visit_seq(&mut seq)?;
                match seq.iter.len() {
                    0 => Ok(out),
                    _ => Err(de::Error::invalid_length(
                        items.len(),
                        &"fewer elements in array",
                    )),
                }
            }
            Value::Map(m) => {
                let mut map = Entries {
                    iter: m.iter(),
                    value: None,
                };
                let out = visitor.visit_map(&mut map)?;
                match map.iter.len() {
                    0 => Ok(out),
                    _ => Err(de::Error::invalid_length(m.len(), &"fewer elements in map")),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Scalar(Scalar::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Scalar(Scalar::Null) => visitor.visit_unit(),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        // A unit variant is its name; any other, a map of its name to its content.
        match &self.0.value {
            Value::Scalar(Scalar::Str(s)) => visitor.visit_enum(Variant {
                name: Cow::Borrowed(s),
                content: None,
            }),
            Value::Scalar(Scalar::Float(f)) if !f.is_finite() => visitor.visit_enum(Variant {
                name: Cow::Owned(format_float(*f)),
                content: None,
            }),
            Value::Map(m) => {
                let mut entries = m.iter();
                match (entries.next(), entries.next()) {
                    (Some((name, entry)), None) => visitor.visit_enum(Variant {
                        name: Cow::Borrowed(name),
                        content: Some(&entry.node),
                    }),
                    _ => Err(de::Error::invalid_value(
                        Unexpected::Map,
                        &"map with a single key",
                    )),
                }
            }
            _ => Err(de::Error::invalid_type(self.unexpected(), &"string or map")),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

struct Items<'a> {
    iter: std::slice::Iter<'a, Node>,
}

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.iter
            .next()
            .map(|n| seed.deserialize(NodeDeserializer(n)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Entries<'a> {
    iter: indexmap::map::Iter<'a, String, Entry>,
    value: Option<&'a Node>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, entry)) = self.iter.next() else {
            return Ok(None);
        };
        self.value = Some(&entry.node);
        seed.deserialize(StrDeserializer::<Error>::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(n) => seed.deserialize(NodeDeserializer(n)),
            None => Err(de::Error::custom("value is missing")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Variant<'a> {
    name: Cow<'a, str>,
    content: Option<&'a Node>,
}

impl<'de, 'a> EnumAccess<'de> for Variant<'a> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let name: StrDeserializer<'_, Error> = self.name.as_ref().into_deserializer();
        let v = seed.deserialize(name)?;
        Ok((v, self))
    }
}

impl<'de> VariantAccess<'de> for Variant<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.content {
            None => Ok(()),
            Some(n) => serde::Deserialize::deserialize(NodeDeserializer(n)),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(NodeDeserializer(self.content("newtype variant")?))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        NodeDeserializer(self.content("tuple variant")?).deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        NodeDeserializer(self.content("struct variant")?).deserialize_any(visitor)
    }
}

impl<'a> Variant<'a> {
    /// The variant's content; a variant written as a bare name has none, serde_json's error
    /// where a `kind` of variant with content was asked for.
    fn content(&self, kind: &'static str) -> Result<&'a Node, Error> {
        self.content
            .ok_or_else(|| de::Error::invalid_type(Unexpected::UnitVariant, &kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Flavour, VerlConfig};

    /// Both ways of typing a tree, compared by outcome: the value (as JSON) or the message.
    fn both(
        node: &Node,
    ) -> (
        Result<serde_json::Value, String>,
        Result<serde_json::Value, String>,
    ) {
        let direct = from_node::<VerlConfig>(node)
            .map(|c| serde_json::to_value(c).unwrap())
            .map_err(|e| e.to_string());
        let via_json = serde_json::from_value::<VerlConfig>(node.to_json())
            .map(|c| serde_json::to_value(c).unwrap())
            .map_err(|e| e.to_string());
        (direct, via_json)
    }

    #[test]
    fn the_tree_types_as_its_json_does() {
        let replacements = [
            Scalar::Null,
            Scalar::Bool(true),
            Scalar::Int(-3),
            Scalar::Int(7),
            Scalar::Float(2.5),
            Scalar::Float(4.0),
            Scalar::Float(f64::INFINITY),
            Scalar::Str("fsdp2".into()),
            Scalar::Str("".into()),
        ];
        let mut typed = 0;
        let mut refused = 0;
        for flavour in [Flavour::Fsdp, Flavour::Megatron] {
            let mut tree = crate::load::compose::builtin_tree(flavour).clone();
            // verl's "must be set" (`???`: the rollout's names) given a value.
            let mut unset = Vec::new();
            tree.walk(&mut |ptr, n, _| {
                if n.as_str() == Some("???") {
                    unset.push(ptr.to_owned());
                }
            });
            for ptr in unset {
                let segs: Vec<&str> = ptr.split('/').filter(|s| !s.is_empty()).collect();
                if let Some(n) = tree.get_path_mut(&segs) {
                    n.value = Value::Scalar(Scalar::Str("vllm".into()));
                }
            }
            let (direct, via_json) = both(&tree);
            assert!(direct.is_ok(), "{direct:?}");
            assert_eq!(direct, via_json);
            let mut paths = Vec::new();
            tree.walk(&mut |ptr, _, _| paths.push(ptr.to_owned()));
            for (i, ptr) in paths.iter().enumerate() {
                let segs: Vec<&str> = ptr.split('/').filter(|s| !s.is_empty()).collect();
                let mut broken = tree.clone();
                let Some(slot) = broken.get_path_mut(&segs) else {
                    continue;
                };
                // Leaves get a scalar of another kind; sections a list or a scalar.
                slot.value = match i % 4 {
                    0 => Value::Seq(vec![Node::scalar(Scalar::Int(1), None)]),
                    _ => Value::Scalar(replacements[i % replacements.len()].clone()),
                };
                let (direct, via_json) = both(&broken);
                assert_eq!(direct, via_json, "at {ptr}");
                if direct.is_ok() {
                    typed += 1;
                } else {
                    refused += 1;
                }
            }
        }
        assert!(
            typed > 100 && refused > 100,
            "{typed} typed, {refused} refused"
        );
    }

    #[test]
    fn enums_options_and_lists_read_as_from_json() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        enum Shape {
            Unit,
            New(i32),
            Pair(u8, u8),
            Named { a: bool },
        }
        let yaml = |text: &str| {
            let text = format!("v: {text}");
            let src = crate::source::Source::new("t.yaml", text, crate::source::SourceKind::File);
            let doc = crate::load::yaml::parse(&src, crate::source::SourceId(0)).unwrap();
            doc.child("v").unwrap().clone()
        };
        for text in [
            "Unit",
            "{New: 3}",
            "{Pair: [1, 2]}",
            "{Named: {a: true}}",
            "{Unit: null}",
            "{Pair: [1, 2, 3]}",
            "{New: 1, Unit: null}",
            "7",
            "Other",
        ] {
            let node = yaml(text);
            let direct = from_node::<Shape>(&node).map_err(|e| e.to_string());
            let via_json =
                serde_json::from_value::<Shape>(node.to_json()).map_err(|e| e.to_string());
            assert_eq!(direct, via_json, "{text}");
        }
        for text in ["[1, 2]", "[1]", "[1, 2, 3]", "null", "[]"] {
            let node = yaml(text);
            let direct = from_node::<Option<(u8, u8)>>(&node).map_err(|e| e.to_string());
            let via_json = serde_json::from_value::<Option<(u8, u8)>>(node.to_json())
                .map_err(|e| e.to_string());
            assert_eq!(direct, via_json, "{text}");
        }
    }
}
