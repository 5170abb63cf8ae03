//! Agent attributes: free-form facts about a machine (`rack:a;zone:b`) that
//! travel in offers so frameworks can place tasks by locality.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One attribute. Values are text unless they parse as a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attribute {
    /// Attribute name, e.g. `rack`.
    pub name: String,
    /// Attribute value.
    #[serde(flatten)]
    pub value: AttributeValue,
}

/// The value of an attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttributeValue {
    /// A string, e.g. `a`.
    Text(String),
    /// A number, e.g. `2`.
    Scalar(f64),
}

/// Why an attribute string was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cannot parse attribute {text:?}: {reason}")]
pub struct AttributeError {
    /// The failing part of the input.
    pub text: String,
    /// What was expected.
    pub reason: String,
}

/// An agent's attributes, in the order given.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Attributes(pub Vec<Attribute>);

// === impl Attributes ===

impl Attributes {
    /// Parses `name:value;name:value`. A name may appear once.
    ///
    /// ```
    /// let a = agora_proto::Attributes::parse("rack:a;zone:b;level:2").unwrap();
    /// assert_eq!(a.text("rack"), Some("a"));
    /// ```
    pub fn parse(text: &str) -> Result<Self, AttributeError> {
        let mut out = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let err = |reason: &str| AttributeError {
                text: part.to_string(),
                reason: reason.to_string(),
            };
            let (name, value) = part
                .split_once(':')
                .ok_or_else(|| err("expected name:value"))?;
            let (name, value) = (name.trim(), value.trim());
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || ":;".contains(c)) {
                return Err(err("the name must be non-empty with no spaces"));
            }
            if value.is_empty() {
                return Err(err("the value must be non-empty"));
            }
            if out.iter().any(|a: &Attribute| a.name == name) {
                return Err(err("attribute given twice"));
            }
            let value = match value.parse::<f64>() {
                Ok(v) if v.is_finite() => AttributeValue::Scalar(v),
                _ => AttributeValue::Text(value.to_string()),
            };
            out.push(Attribute {
                name: name.to_string(),
                value,
            });
        }
        Ok(Attributes(out))
    }

    /// The attribute called `name`.
    pub fn get(&self, name: &str) -> Option<&AttributeValue> {
        self.0.iter().find(|a| a.name == name).map(|a| &a.value)
    }

    /// The text value of `name`, if it is text.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Some(AttributeValue::Text(t)) => Some(t),
            _ => None,
        }
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeValue::Text(t) => f.write_str(t),
            AttributeValue::Scalar(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{}:{}", a.name, a.value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        let a = Attributes::parse("rack:a; zone:us-1;level:2").unwrap();
        assert_eq!(a.text("zone"), Some("us-1"));
        assert_eq!(a.get("level"), Some(&AttributeValue::Scalar(2.0)));
        assert_eq!(a.to_string(), "rack:a;zone:us-1;level:2");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"[{"name":"rack","text":"a"},{"name":"zone","text":"us-1"},{"name":"level","scalar":2.0}]"#
        );
        assert_eq!(serde_json::from_str::<Attributes>(&json).unwrap(), a);
    }

    #[test]
    fn rejects_bad_input() {
        for bad in ["rack", "rack:", ":a", "rack:a;rack:b", "my rack:a"] {
            assert!(Attributes::parse(bad).is_err(), "{bad}");
        }
    }
}
