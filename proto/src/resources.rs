//! Resources: named quantities an agent offers and a task consumes.
//!
//! Three kinds of value, as in Mesos: scalars (`cpus:4`, `mem:8192`), ranges
//! (`ports:[31000-32000]`) and sets (`disks:{a,b}`). A resource may be
//! reserved for a role with `name(role):value`; unreserved resources have
//! the role `*`.
//!
//! [`Resources`] is always normalized: one entry per (name, role, kind),
//! sorted, with no empty values, scalars rounded to three decimal places
//! (Mesos's fixed-point rule, so `0.1 + 0.2` subtracts back exactly), never
//! negative and never NaN. Arithmetic cannot break these rules:
//! [`Resources::checked_sub`] refuses to take away what is not there.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The role of unreserved resources.
pub const DEFAULT_ROLE: &str = "*";

/// Largest scalar accepted (well above any real machine, well below the
/// point where `f64` stops holding three decimal places exactly).
pub const MAX_SCALAR: f64 = 1e12;

/// Most ranges, or set items, one resource may carry in a message: a
/// decoder stops at the next one, so a peer cannot make a process build a
/// set of millions of items before any check sees it. (The master bounds
/// an agent's far lower: `--max-agent-set-items`, `--max-agent-ranges`.)
pub const MAX_WIRE_ITEMS: usize = 65_536;

/// What is wrong with a resource string or value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResourceError {
    /// The text could not be parsed.
    #[error("cannot parse resource {text:?}: {reason}")]
    Parse {
        /// The part of the input that failed.
        text: String,
        /// What was expected.
        reason: String,
    },
    /// A scalar is negative, NaN, infinite or too large.
    #[error("resource {name} has invalid scalar value {value}: must be a finite number between 0 and {MAX_SCALAR}")]
    BadScalar {
        /// Resource name.
        name: String,
        /// The rejected value.
        value: f64,
    },
    /// A range has its end before its begin.
    #[error("resource {name} has invalid range [{begin}-{end}]: begin must not exceed end")]
    BadRange {
        /// Resource name.
        name: String,
        /// Range start.
        begin: u64,
        /// Range end.
        end: u64,
    },
    /// Ranges or set items given twice for one resource.
    #[error("resource {name} lists overlapping ranges or repeated items")]
    Overlap {
        /// Resource name.
        name: String,
    },
    /// A resource name or role is empty or has a reserved character.
    #[error("invalid resource name or role {0:?}")]
    BadName(String),
    /// A resource entry on the wire gives no value or more than one.
    #[error("resource {0} must have exactly one of scalar, ranges or set")]
    BadKind(String),
    /// A subtraction asked for more than is there.
    #[error("insufficient resources: needed {needed}, have {available}")]
    Insufficient {
        /// What was asked for.
        needed: Resources,
        /// What there was.
        available: Resources,
    },
}

/// An inclusive range of integers, `[begin, end]` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Range {
    /// First value in the range.
    pub begin: u64,
    /// Last value in the range (inclusive).
    pub end: u64,
}

/// The value of one resource.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A quantity, rounded to three decimal places, `>= 0`.
    Scalar(f64),
    /// Sorted, non-overlapping, non-adjacent inclusive ranges.
    Ranges(Vec<Range>),
    /// A set of named items.
    Set(BTreeSet<String>),
}

/// One named resource, possibly reserved for a role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ResourceWire", into = "ResourceWire")]
pub struct Resource {
    /// Resource name, e.g. `cpus`.
    pub name: String,
    /// Role the resource is reserved for, or [`DEFAULT_ROLE`].
    pub role: String,
    /// The quantity.
    pub value: Value,
}

/// A normalized bag of resources. See the module documentation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<Resource>", into = "Vec<Resource>")]
pub struct Resources {
    items: Vec<Resource>,
}

#[derive(Serialize, Deserialize)]
struct ResourceWire {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scalar: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_list"
    )]
    ranges: Option<Vec<(u64, u64)>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_list"
    )]
    set: Option<Vec<String>>,
}

/// A list of at most [`MAX_WIRE_ITEMS`], refused at the next item.
fn bounded_list<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<BoundedList<T>>::deserialize(deserializer)?.map(|list| list.0))
}

/// What [`bounded_list`] decodes.
struct BoundedList<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for BoundedList<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visitor<T> {
            type Value = BoundedList<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a list of at most {MAX_WIRE_ITEMS} items")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element()? {
                    if out.len() == MAX_WIRE_ITEMS {
                        return Err(serde::de::Error::custom(format!(
                            "a resource carries more than {MAX_WIRE_ITEMS} ranges or set items"
                        )));
                    }
                    out.push(item);
                }
                Ok(BoundedList(out))
            }
        }
        deserializer.deserialize_seq(Visitor(std::marker::PhantomData))
    }
}

/// Rounds to Mesos's fixed point of three decimal places: what
/// `(value * 1000.0).round() / 1000.0` gives, bit for bit, without a call
/// to the software `round` of the baseline x86-64 target (the allocator
/// rounds several times per offer).
pub fn round_scalar(value: f64) -> f64 {
    let y = value * 1000.0;
    // Beyond 2^52 every f64 is an integer already (and NaN, inf stay).
    if y.is_nan() || y.abs() >= 4_503_599_627_370_496.0 {
        return y.round() / 1000.0;
    }
    // Exact: |y| < 2^52 truncates to an i64 and back without loss.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let t = y as i64 as f64;
    let d = y - t;
    let r = if d >= 0.5 {
        t + 1.0
    } else if d <= -0.5 {
        t - 1.0
    } else {
        t
    };
    // Halfway cases go away from zero, and a zero keeps y's sign, as
    // `f64::round` does.
    r.copysign(y) / 1000.0
}

fn check_name(name: &str) -> Result<(), ResourceError> {
    let bad = name.is_empty()
        || name.len() > 128
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || ";:()[]{},".contains(c));
    if bad {
        Err(ResourceError::BadName(name.to_string()))
    } else {
        Ok(())
    }
}

fn check_role(role: &str) -> Result<(), ResourceError> {
    if role == DEFAULT_ROLE {
        return Ok(());
    }
    let bad = role.is_empty()
        || role.len() > 128
        || role.starts_with('-')
        || role == "."
        || role == ".."
        || role
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || "._-/".contains(c)));
    if bad {
        Err(ResourceError::BadName(role.to_string()))
    } else {
        Ok(())
    }
}

fn check_scalar(name: &str, value: f64) -> Result<f64, ResourceError> {
    if !value.is_finite() || !(0.0..=MAX_SCALAR).contains(&value) {
        return Err(ResourceError::BadScalar {
            name: name.to_string(),
            value,
        });
    }
    Ok(round_scalar(value))
}

/// Sorts and merges ranges; `strict` refuses overlaps (input from a user).
fn normalize_ranges(
    name: &str,
    mut ranges: Vec<Range>,
    strict: bool,
) -> Result<Vec<Range>, ResourceError> {
    for r in &ranges {
        if r.begin > r.end {
            return Err(ResourceError::BadRange {
                name: name.to_string(),
                begin: r.begin,
                end: r.end,
            });
        }
    }
    ranges.sort();
    let mut out: Vec<Range> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.begin <= last.end => {
                if strict {
                    return Err(ResourceError::Overlap {
                        name: name.to_string(),
                    });
                }
                last.end = last.end.max(r.end);
            }
            Some(last) if last.end.checked_add(1) == Some(r.begin) => last.end = r.end,
            _ => out.push(r),
        }
    }
    Ok(out)
}

/// Union of two normalized range lists (sorted, disjoint, non-adjacent).
fn ranges_union(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j == b.len() || (i < a.len() && a[i].begin <= b[j].begin) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            Some(last) if next.begin <= last.end.saturating_add(1) => {
                last.end = last.end.max(next.end);
            }
            _ => out.push(next),
        }
    }
    out
}

fn ranges_contain(outer: &[Range], inner: &[Range]) -> bool {
    // Both normalized: walk them together.
    let mut i = 0;
    for r in inner {
        while i < outer.len() && outer[i].end < r.begin {
            i += 1;
        }
        if i == outer.len() || outer[i].begin > r.begin || outer[i].end < r.end {
            return false;
        }
    }
    true
}

fn ranges_sub(outer: &[Range], inner: &[Range]) -> Vec<Range> {
    let mut out = Vec::with_capacity(outer.len() + 1);
    let mut j = 0;
    for o in outer {
        let mut begin = o.begin;
        let end = o.end;
        while j < inner.len() && inner[j].end < begin {
            j += 1;
        }
        let mut k = j;
        let mut done = false;
        while k < inner.len() && inner[k].begin <= end {
            let r = inner[k];
            if r.begin > begin {
                out.push(Range {
                    begin,
                    end: r.begin - 1,
                });
            }
            if r.end >= end {
                done = true;
                break;
            }
            begin = r.end + 1;
            k += 1;
        }
        if !done {
            out.push(Range { begin, end });
        }
    }
    out
}

fn ranges_len(ranges: &[Range]) -> u64 {
    ranges.iter().map(|r| r.end - r.begin + 1).sum()
}

// === impl Value ===

impl Value {
    fn kind(&self) -> u8 {
        match self {
            Value::Scalar(_) => 0,
            Value::Ranges(_) => 1,
            Value::Set(_) => 2,
        }
    }

    /// Whether nothing is left: a scalar at or below zero, no range, an
    /// empty set.
    pub fn is_empty(&self) -> bool {
        match self {
            Value::Scalar(v) => *v <= 0.0,
            Value::Ranges(r) => r.is_empty(),
            Value::Set(s) => s.is_empty(),
        }
    }

    /// Adds `other` of the same kind (a value of another kind is ignored):
    /// scalars add (rounded, capped at [`MAX_SCALAR`]), ranges and sets
    /// unite.
    pub fn add(&mut self, other: &Value) {
        match (self, other) {
            (Value::Scalar(a), Value::Scalar(b)) => *a = round_scalar((*a + b).min(MAX_SCALAR)),
            (Value::Ranges(a), Value::Ranges(b)) => *a = ranges_union(a, b),
            (Value::Set(a), Value::Set(b)) => a.extend(b.iter().cloned()),
            _ => debug_assert!(false, "values of one kind are added only to their own kind"),
        }
    }

    /// Whether `other` (of the same kind) fits in `self`.
    pub fn contains(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Scalar(a), Value::Scalar(b)) => round_scalar(a - b) >= 0.0,
            (Value::Ranges(a), Value::Ranges(b)) => ranges_contain(a, b),
            (Value::Set(a), Value::Set(b)) => b.is_subset(a),
            _ => false,
        }
    }

    /// `self - other`, assuming `self.contains(other)` or saturating; a
    /// value of another kind leaves `self` as it is.
    pub fn sub(&self, other: &Value) -> Value {
        match (self, other) {
            (Value::Scalar(a), Value::Scalar(b)) => Value::Scalar(round_scalar(a - b).max(0.0)),
            (Value::Ranges(a), Value::Ranges(b)) => Value::Ranges(ranges_sub(a, b)),
            (Value::Set(a), Value::Set(b)) => Value::Set(a.difference(b).cloned().collect()),
            _ => self.clone(),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Scalar(v) => write!(f, "{v}"),
            Value::Ranges(ranges) => {
                f.write_str("[")?;
                for (i, r) in ranges.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}-{}", r.begin, r.end)?;
                }
                f.write_str("]")
            }
            Value::Set(items) => {
                f.write_str("{")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(item)?;
                }
                f.write_str("}")
            }
        }
    }
}

// === impl Resource ===

impl Resource {
    /// A validated scalar resource in the default role.
    pub fn scalar(name: &str, value: f64) -> Result<Self, ResourceError> {
        check_name(name)?;
        Ok(Self {
            name: name.to_string(),
            role: DEFAULT_ROLE.to_string(),
            value: Value::Scalar(check_scalar(name, value)?),
        })
    }

    /// A validated ranges resource in the default role.
    pub fn ranges(name: &str, ranges: &[(u64, u64)]) -> Result<Self, ResourceError> {
        check_name(name)?;
        let ranges = ranges
            .iter()
            .map(|&(begin, end)| Range { begin, end })
            .collect();
        Ok(Self {
            name: name.to_string(),
            role: DEFAULT_ROLE.to_string(),
            value: Value::Ranges(normalize_ranges(name, ranges, true)?),
        })
    }

    /// The same resource reserved for `role`.
    pub fn with_role(mut self, role: &str) -> Result<Self, ResourceError> {
        check_role(role)?;
        self.role = role.to_string();
        Ok(self)
    }

    fn key(&self) -> (&str, &str, u8) {
        (&self.name, &self.role, self.value.kind())
    }

    /// Whether this resource is reserved for a role.
    pub fn is_reserved(&self) -> bool {
        self.role != DEFAULT_ROLE
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_reserved() {
            write!(f, "{}({}):{}", self.name, self.role, self.value)
        } else {
            write!(f, "{}:{}", self.name, self.value)
        }
    }
}

impl TryFrom<ResourceWire> for Resource {
    type Error = ResourceError;

    fn try_from(wire: ResourceWire) -> Result<Self, ResourceError> {
        check_name(&wire.name)?;
        let role = wire.role.unwrap_or_else(|| DEFAULT_ROLE.to_string());
        check_role(&role)?;
        let value = match (wire.scalar, wire.ranges, wire.set) {
            (Some(v), None, None) => Value::Scalar(check_scalar(&wire.name, v)?),
            (None, Some(r), None) => {
                let r = r
                    .into_iter()
                    .map(|(begin, end)| Range { begin, end })
                    .collect();
                Value::Ranges(normalize_ranges(&wire.name, r, true)?)
            }
            (None, None, Some(s)) => {
                let len = s.len();
                let set: BTreeSet<String> = s.into_iter().collect();
                if set.len() != len {
                    return Err(ResourceError::Overlap { name: wire.name });
                }
                for item in &set {
                    check_name(item)?;
                }
                Value::Set(set)
            }
            _ => return Err(ResourceError::BadKind(wire.name)),
        };
        Ok(Resource {
            name: wire.name,
            role,
            value,
        })
    }
}

impl From<Resource> for ResourceWire {
    fn from(r: Resource) -> Self {
        let role = (r.role != DEFAULT_ROLE).then_some(r.role);
        let (scalar, ranges, set) = match r.value {
            Value::Scalar(v) => (Some(v), None, None),
            Value::Ranges(rs) => (
                None,
                Some(rs.into_iter().map(|r| (r.begin, r.end)).collect()),
                None,
            ),
            Value::Set(s) => (None, None, Some(s.into_iter().collect())),
        };
        ResourceWire {
            name: r.name,
            role,
            scalar,
            ranges,
            set,
        }
    }
}

// === impl Resources ===

impl Resources {
    /// No resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses Mesos's resource syntax: `name[(role)]:value` joined by `;`,
    /// where a value is a number, `[a-b,c-d]` ranges or `{x,y}` a set.
    /// The same name and role given twice are added together.
    ///
    /// ```
    /// use agora_proto::Resources;
    /// let r = Resources::parse("cpus:4;mem:8192;ports:[31000-32000]").unwrap();
    /// assert_eq!(r.cpus(), 4.0);
    /// assert!(Resources::parse("cpus:-1").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, ResourceError> {
        let mut out = Resources::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let err = |reason: &str| ResourceError::Parse {
                text: part.to_string(),
                reason: reason.to_string(),
            };
            let (head, value) = part
                .split_once(':')
                .ok_or_else(|| err("expected name:value"))?;
            let head = head.trim();
            let value = value.trim();
            let (name, role) = match head.split_once('(') {
                Some((name, rest)) => {
                    let role = rest
                        .strip_suffix(')')
                        .ok_or_else(|| err("expected name(role)"))?;
                    (name.trim(), role.trim())
                }
                None => (head, DEFAULT_ROLE),
            };
            check_name(name)?;
            check_role(role)?;
            let value = if let Some(inner) = value.strip_prefix('[') {
                let inner = inner
                    .strip_suffix(']')
                    .ok_or_else(|| err("ranges must end with ]"))?;
                let mut ranges = Vec::new();
                for item in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let (b, e) = item
                        .split_once('-')
                        .ok_or_else(|| err("a range is begin-end"))?;
                    let begin = b
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| err("range bounds must be non-negative integers"))?;
                    let end = e
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| err("range bounds must be non-negative integers"))?;
                    ranges.push(Range { begin, end });
                }
                Value::Ranges(normalize_ranges(name, ranges, true)?)
            } else if let Some(inner) = value.strip_prefix('{') {
                let inner = inner
                    .strip_suffix('}')
                    .ok_or_else(|| err("sets must end with }"))?;
                let mut set = BTreeSet::new();
                for item in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    check_name(item)?;
                    if !set.insert(item.to_string()) {
                        return Err(ResourceError::Overlap {
                            name: name.to_string(),
                        });
                    }
                }
                Value::Set(set)
            } else {
                let v: f64 = value
                    .parse()
                    .map_err(|_| err("a scalar must be a number"))?;
                Value::Scalar(check_scalar(name, v)?)
            };
            let resource = Resource {
                name: name.to_string(),
                role: role.to_string(),
                value,
            };
            if let Some(existing) = out.find(resource.key()) {
                let overlaps = match (&existing.value, &resource.value) {
                    (Value::Ranges(a), Value::Ranges(b)) => ranges_sub(b, a) != *b,
                    (Value::Set(a), Value::Set(b)) => !a.is_disjoint(b),
                    _ => false,
                };
                if overlaps {
                    return Err(ResourceError::Overlap {
                        name: name.to_string(),
                    });
                }
            }
            out.add_resource(resource);
        }
        Ok(out)
    }

    fn find(&self, key: (&str, &str, u8)) -> Option<&Resource> {
        self.items
            .binary_search_by(|r| r.key().cmp(&key))
            .ok()
            .map(|i| &self.items[i])
    }

    /// Adds one resource, merging it with an entry of the same name, role and kind.
    pub fn add_resource(&mut self, resource: Resource) {
        if resource.value.is_empty() {
            return;
        }
        match self
            .items
            .binary_search_by(|r| r.key().cmp(&resource.key()))
        {
            Ok(i) => self.items[i].value.add(&resource.value),
            Err(i) => self.items.insert(i, resource),
        }
    }

    /// Adds everything in `other`.
    pub fn add_all(&mut self, other: &Resources) {
        for r in &other.items {
            self.add_resource(r.clone());
        }
    }

    /// Whether every resource in `other` is available here (same role).
    pub fn contains(&self, other: &Resources) -> bool {
        other.items.iter().all(|r| {
            self.find(r.key())
                .is_some_and(|mine| mine.value.contains(&r.value))
        })
    }

    /// `self - other`, or [`ResourceError::Insufficient`] when `other` is
    /// not contained in `self`. Never yields a negative quantity.
    pub fn checked_sub(&self, other: &Resources) -> Result<Resources, ResourceError> {
        if !self.contains(other) {
            return Err(ResourceError::Insufficient {
                needed: other.clone(),
                available: self.clone(),
            });
        }
        Ok(self.saturating_sub(other))
    }

    /// Removes from `self` whatever part of `other` it holds; what it does
    /// not hold is ignored. For bookkeeping that must not fail (recovery).
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        let mut out = Vec::with_capacity(self.items.len());
        for mine in &self.items {
            let value = match other.find(mine.key()) {
                Some(theirs) => mine.value.sub(&theirs.value),
                None => mine.value.clone(),
            };
            if !value.is_empty() {
                out.push(Resource {
                    name: mine.name.clone(),
                    role: mine.role.clone(),
                    value,
                });
            }
        }
        Resources { items: out }
    }

    /// Whether there is nothing here.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The normalized entries.
    pub fn iter(&self) -> impl Iterator<Item = &Resource> {
        self.items.iter()
    }

    /// Sum of the scalar resource `name` over all roles (0 when absent).
    pub fn scalar(&self, name: &str) -> f64 {
        // A fold from +0.0, not `sum()`: the sum of no f64 is -0.0, which
        // JSON writes as `-0.0` for a resource that is simply absent.
        round_scalar(
            self.items
                .iter()
                .filter(|r| r.name == name)
                .filter_map(|r| match r.value {
                    Value::Scalar(v) => Some(v),
                    _ => None,
                })
                .fold(0.0, |sum, v| sum + v),
        )
    }

    /// `cpus`, summed over roles.
    pub fn cpus(&self) -> f64 {
        self.scalar("cpus")
    }

    /// `mem` in MiB, summed over roles.
    pub fn mem(&self) -> f64 {
        self.scalar("mem")
    }

    /// `disk` in MiB, summed over roles.
    pub fn disk(&self) -> f64 {
        self.scalar("disk")
    }

    /// The `ports` ranges (all roles merged).
    pub fn ports(&self) -> Vec<Range> {
        let all = self
            .items
            .iter()
            .filter(|r| r.name == "ports")
            .filter_map(|r| match &r.value {
                Value::Ranges(rs) => Some(rs.iter().copied()),
                _ => None,
            })
            .flatten()
            .collect();
        normalize_ranges("ports", all, false).unwrap_or_default()
    }

    /// Number of values in the ranges resource `name` (e.g. ports count).
    pub fn range_count(&self, name: &str) -> u64 {
        self.items
            .iter()
            .filter(|r| r.name == name)
            .map(|r| match &r.value {
                Value::Ranges(rs) => ranges_len(rs),
                _ => 0,
            })
            .sum()
    }

    /// The scalar entries as (name, quantity), summed over roles.
    pub fn scalar_totals(&self) -> Vec<(&str, f64)> {
        let mut out: Vec<(&str, f64)> = Vec::new();
        for r in &self.items {
            if let Value::Scalar(v) = r.value {
                match out.iter_mut().find(|(n, _)| *n == r.name) {
                    Some((_, total)) => *total = round_scalar(*total + v),
                    None => out.push((&r.name, v)),
                }
            }
        }
        out
    }

    /// Only the entries whose role satisfies `keep`.
    pub fn filter_roles(&self, keep: impl Fn(&str) -> bool) -> Resources {
        Resources {
            items: self
                .items
                .iter()
                .filter(|r| keep(&r.role))
                .cloned()
                .collect(),
        }
    }

    /// What a framework in `roles` may be offered: unreserved resources and
    /// those reserved for one of its roles.
    pub fn allocatable_to(&self, roles: &[String]) -> Resources {
        self.filter_roles(|role| role == DEFAULT_ROLE || roles.iter().any(|r| r == role))
    }

    /// Whether there is at least one positive quantity of `cpus` or `mem`
    /// (used to skip offers too small to be worth sending).
    pub fn at_least(&self, min_cpus: f64, min_mem: f64) -> bool {
        self.cpus() >= min_cpus || self.mem() >= min_mem
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for Resources {
    type Err = ResourceError;

    fn from_str(s: &str) -> Result<Self, ResourceError> {
        Resources::parse(s)
    }
}

impl TryFrom<Vec<Resource>> for Resources {
    type Error = ResourceError;

    fn try_from(items: Vec<Resource>) -> Result<Self, ResourceError> {
        let mut out = Resources::new();
        for r in items {
            out.add_resource(r);
        }
        Ok(out)
    }
}

impl From<Resources> for Vec<Resource> {
    fn from(r: Resources) -> Self {
        r.items
    }
}

impl std::ops::Add<&Resources> for &Resources {
    type Output = Resources;

    fn add(self, rhs: &Resources) -> Resources {
        let mut out = self.clone();
        out.add_all(rhs);
        out
    }
}

impl std::ops::AddAssign<&Resources> for Resources {
    fn add_assign(&mut self, rhs: &Resources) {
        self.add_all(rhs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_scalar_is_a_positive_zero() {
        let r = Resources::parse("mem:32").unwrap();
        assert!(r.scalar("cpus").is_sign_positive());
        assert_eq!(serde_json::json!(r.scalar("gpus")).to_string(), "0.0");
        assert!(Resources::new().scalar("mem").is_sign_positive());
    }

    #[test]
    fn a_resource_on_the_wire_carries_at_most_max_wire_items() {
        let set = |n: usize| {
            let items: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
            serde_json::json!([{"name": "gpus", "set": items}]).to_string()
        };
        let r: Resources = serde_json::from_str(&set(MAX_WIRE_ITEMS)).unwrap();
        assert_eq!(r.iter().count(), 1);
        let e = serde_json::from_str::<Resources>(&set(MAX_WIRE_ITEMS + 1)).unwrap_err();
        assert!(e.to_string().contains("more than 65536"), "{e}");
        let ranges: Vec<(u64, u64)> = (0..=MAX_WIRE_ITEMS as u64)
            .map(|i| (3 * i, 3 * i))
            .collect();
        let text = serde_json::json!([{"name": "ports", "ranges": ranges}]).to_string();
        assert!(serde_json::from_str::<Resources>(&text).is_err());
        // An explicit null is still no value.
        let text = r#"[{"name": "cpus", "scalar": 1, "set": null, "ranges": null}]"#;
        assert!(serde_json::from_str::<Resources>(text).is_ok());
    }
    use proptest::prelude::*;

    fn r(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    #[test]
    fn parses_mesos_syntax() {
        let res = r("cpus:4;mem:8192;disk:20000;ports:[31000-32000]");
        assert_eq!(res.cpus(), 4.0);
        assert_eq!(res.mem(), 8192.0);
        assert_eq!(res.disk(), 20000.0);
        assert_eq!(res.range_count("ports"), 1001);
        assert_eq!(
            res.to_string(),
            "cpus:4;disk:20000;mem:8192;ports:[31000-32000]"
        );
    }

    #[test]
    fn parses_roles_sets_and_whitespace() {
        let res = r(" cpus(web):2 ; cpus:1; disks:{a,b}; ports:[1-2, 5-6] ");
        assert_eq!(res.cpus(), 3.0);
        assert_eq!(res.filter_roles(|role| role == "web").cpus(), 2.0);
        assert_eq!(res.allocatable_to(&[]).cpus(), 1.0);
        assert_eq!(res.allocatable_to(&["web".to_string()]).cpus(), 3.0);
        assert!(res.to_string().contains("cpus(web):2"));
        assert!(res.to_string().contains("disks:{a,b}"));
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "cpus:-1",
            "cpus:abc",
            "cpus:NaN",
            "cpus:inf",
            "cpus",
            ":4",
            "cpus(:4",
            "ports:[5-1]",
            "ports:[1-5,3-7]",
            "ports:[1-5",
            "ports:[a-b]",
            "disks:{a,a}",
            "cpus(bad role):1",
            "cpus:1e300",
        ] {
            assert!(Resources::parse(bad).is_err(), "{bad} should be rejected");
        }
        let err = Resources::parse("cpus:abc").unwrap_err().to_string();
        assert!(err.contains("cpus:abc"), "{err}");
    }

    #[test]
    fn duplicate_names_add_up() {
        assert_eq!(r("cpus:1;cpus:2.5").cpus(), 3.5);
        assert!(Resources::parse("ports:[1-5];ports:[3-4]").is_err());
        assert_eq!(r("ports:[1-5];ports:[6-9]").range_count("ports"), 9);
    }

    #[test]
    fn arithmetic() {
        let total = r("cpus:4;mem:1024;ports:[31000-31009]");
        let task = r("cpus:0.1;mem:32;ports:[31002-31003]");
        assert!(total.contains(&task));
        let left = total.checked_sub(&task).unwrap();
        assert_eq!(left.cpus(), 3.9);
        assert_eq!(left.mem(), 992.0);
        assert_eq!(left.range_count("ports"), 8);
        assert_eq!(&left + &task, total);
        assert!(matches!(
            task.checked_sub(&total),
            Err(ResourceError::Insufficient { .. })
        ));
        // Reserved resources are not interchangeable with unreserved ones.
        assert!(!r("cpus:4").contains(&r("cpus(web):1")));
    }

    #[test]
    fn fixed_point_keeps_sums_exact() {
        let mut acc = Resources::new();
        let tenth = r("cpus:0.1");
        for _ in 0..10 {
            acc += &tenth;
        }
        assert_eq!(acc.cpus(), 1.0);
        for _ in 0..10 {
            acc = acc.checked_sub(&tenth).unwrap();
        }
        assert!(acc.is_empty());
    }

    #[test]
    fn json_round_trip_and_validation() {
        let res = r("cpus(web):2;mem:64;ports:[1-3,7-7];disks:{x}");
        let json = serde_json::to_string(&res).unwrap();
        let back: Resources = serde_json::from_str(&json).unwrap();
        assert_eq!(back, res);
        for bad in [
            r#"[{"name":"cpus","scalar":-1}]"#,
            r#"[{"name":"cpus"}]"#,
            r#"[{"name":"cpus","scalar":1,"set":["a"]}]"#,
            r#"[{"name":"ports","ranges":[[5,1]]}]"#,
            r#"[{"name":"","scalar":1}]"#,
        ] {
            assert!(serde_json::from_str::<Resources>(bad).is_err(), "{bad}");
        }
    }

    fn arb_resources() -> impl Strategy<Value = Resources> {
        (
            0u32..64_000,
            0u32..100_000,
            proptest::collection::vec((0u64..2000, 0u64..50), 0..5),
            proptest::bool::ANY,
        )
            .prop_map(|(cpus_milli, mem, ranges, reserved)| {
                let mut out = Resources::new();
                let cpu = Resource::scalar("cpus", f64::from(cpus_milli) / 1000.0).unwrap();
                let cpu = if reserved {
                    cpu.with_role("web").unwrap()
                } else {
                    cpu
                };
                out.add_resource(cpu);
                out.add_resource(Resource::scalar("mem", f64::from(mem)).unwrap());
                let ranges: Vec<Range> = ranges
                    .into_iter()
                    .map(|(b, len)| Range {
                        begin: b,
                        end: b + len,
                    })
                    .collect();
                if let Ok(rs) = normalize_ranges("ports", ranges, false) {
                    out.add_resource(Resource {
                        name: "ports".into(),
                        role: DEFAULT_ROLE.into(),
                        value: Value::Ranges(rs),
                    });
                }
                out
            })
    }

    proptest! {
        /// The fast `round_scalar` is `f64::round` at three places, bit
        /// for bit.
        #[test]
        fn round_scalar_is_round_at_three_places(
            x in prop_oneof![
                any::<f64>(),
                -1e13f64..1e13,
                (-1_000_000i64..1_000_000).prop_map(|n| n as f64 / 1000.0),
                (-1_000_000i64..1_000_000).prop_map(|n| (n as f64 + 0.5) / 1000.0),
                (-100i64..100).prop_map(|n| n as f64 * 1e-4),
            ]
        ) {
            let want = (x * 1000.0).round() / 1000.0;
            let got = round_scalar(x);
            prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x}: {got} != {want}");
        }

        #[test]
        fn add_then_sub_round_trips(a in arb_resources(), b in arb_resources()) {
            let sum = &a + &b;
            prop_assert!(sum.contains(&a));
            prop_assert!(sum.contains(&b));
            let back = sum.checked_sub(&b).unwrap();
            // Ranges may overlap between a and b, so only scalars are exact.
            prop_assert_eq!(back.cpus(), a.cpus());
            prop_assert_eq!(back.mem(), a.mem());
        }

        #[test]
        fn sub_never_negative(a in arb_resources(), b in arb_resources()) {
            let diff = a.saturating_sub(&b);
            for res in diff.iter() {
                if let Value::Scalar(v) = res.value {
                    prop_assert!(v > 0.0 && v.is_finite());
                }
            }
            prop_assert!(a.contains(&diff));
            match a.checked_sub(&b) {
                Ok(d) => prop_assert!(a.contains(&b) && d == diff),
                Err(_) => prop_assert!(!a.contains(&b)),
            }
        }

        #[test]
        fn display_parse_round_trip(a in arb_resources()) {
            let text = a.to_string();
            prop_assert_eq!(Resources::parse(&text).unwrap(), a);
        }

        #[test]
        fn json_round_trip(a in arb_resources()) {
            let json = serde_json::to_string(&a).unwrap();
            prop_assert_eq!(serde_json::from_str::<Resources>(&json).unwrap(), a);
        }

        #[test]
        fn parse_never_panics(s in "[a-z():;\\[\\]{},0-9.\\- ]{0,40}") {
            let _ = Resources::parse(&s);
        }
    }
}
