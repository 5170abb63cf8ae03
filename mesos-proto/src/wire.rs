//! The fast path's check of proto2 required fields, on the wire.
//!
//! Walking a message's descriptors with prost-reflect costs a reference
//! count change on the shared descriptor pool per field looked at, and
//! those counts bounce between the cores of every thread decoding. So the
//! shape the walk needs is built once from the pool (for each message:
//! its field numbers, its required ones and its message-typed fields) and
//! the walk only reads it.

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::LazyLock;

use prost::encoding::{decode_key, decode_varint, WireType};
use prost_reflect::{Cardinality, Kind, MessageDescriptor, ReflectMessage};

use crate::DESCRIPTOR_POOL;

/// Deepest nesting [`required_fields_present`] follows.
const MAX_WIRE_DEPTH: usize = 32;

/// What the walk knows of one message type.
#[derive(Debug, Default)]
struct Shape {
    /// Bits of the required field numbers (all of Mesos's are below 128).
    required: u128,
    /// A required field numbered 128 or above: never sure on the wire.
    untracked_required: bool,
    /// Bits of the message's field numbers below 128.
    known: u128,
    /// Its field numbers of 128 and above.
    known_high: Vec<u32>,
    /// Message-typed fields: number, shape index, singular.
    children: Vec<(u32, usize, bool)>,
}

/// Every message of the pool's shape, and their indices by full name.
struct Shapes {
    shapes: Vec<Shape>,
    by_name: HashMap<String, usize>,
}

static SHAPES: LazyLock<Shapes> = LazyLock::new(|| {
    let messages: Vec<MessageDescriptor> = DESCRIPTOR_POOL.all_messages().collect();
    let by_name: HashMap<String, usize> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| (m.full_name().to_string(), i))
        .collect();
    let shapes: Vec<Shape> = messages
        .iter()
        .map(|m| {
            let mut shape = Shape::default();
            for field in m.fields() {
                if field.number() < 128 {
                    shape.known |= 1u128 << field.number();
                } else {
                    shape.known_high.push(field.number());
                }
                if field.cardinality() == Cardinality::Required {
                    if field.number() < 128 {
                        shape.required |= 1u128 << field.number();
                    } else {
                        shape.untracked_required = true;
                    }
                }
                if let Kind::Message(inner) = field.kind() {
                    let index = by_name[inner.full_name()];
                    let singular = !field.is_list() && !field.is_map();
                    shape.children.push((field.number(), index, singular));
                }
            }
            shape
        })
        .collect();
    Shapes { shapes, by_name }
});

/// Whether the protobuf encoding `bytes` of a `descriptor` message sets
/// every proto2 required field, recursively, and only fields the message
/// has, judged from the wire alone.
/// `false` means "not sure" (a field is missing, a field number is not the
/// message's, the bytes are malformed,
/// a singular message appears more than once and would be merged, groups,
/// a required field beyond what is tracked): the caller then decodes
/// reflectively, which says exactly what is wrong.
pub(crate) fn required_fields_present<T: ReflectMessage + Default + 'static>(bytes: &[u8]) -> bool {
    match shape_of::<T>() {
        Some(index) => walk(&SHAPES.shapes, index, bytes, 0),
        None => false,
    }
}

thread_local! {
    /// Shape indices by message type, per thread: the lookup by name
    /// takes a descriptor (a shared reference count) the first time only.
    static INDICES: RefCell<HashMap<TypeId, Option<usize>>> = RefCell::default();
}

/// `T`'s index in [`SHAPES`].
fn shape_of<T: ReflectMessage + Default + 'static>() -> Option<usize> {
    INDICES.with(|indices| {
        *indices
            .borrow_mut()
            .entry(TypeId::of::<T>())
            .or_insert_with(|| {
                SHAPES
                    .by_name
                    .get(T::default().descriptor().full_name())
                    .copied()
            })
    })
}

fn walk(shapes: &[Shape], index: usize, bytes: &[u8], depth: usize) -> bool {
    let shape = &shapes[index];
    if depth > MAX_WIRE_DEPTH || shape.untracked_required {
        return false;
    }
    // Field numbers seen, for the numbers a bitmask holds.
    let mut seen: u128 = 0;
    let mut buf = bytes;
    while !buf.is_empty() {
        let Ok((number, wire_type)) = decode_key(&mut buf) else {
            return false;
        };
        let bit = if number < 128 { 1u128 << number } else { 0 };
        let known = if number < 128 {
            shape.known & bit != 0
        } else {
            shape.known_high.contains(&number)
        };
        if !known {
            return false;
        }
        match wire_type {
            WireType::Varint => {
                if decode_varint(&mut buf).is_err() {
                    return false;
                }
            }
            WireType::SixtyFourBit => {
                let Some(rest) = buf.get(8..) else {
                    return false;
                };
                buf = rest;
            }
            WireType::ThirtyTwoBit => {
                let Some(rest) = buf.get(4..) else {
                    return false;
                };
                buf = rest;
            }
            WireType::LengthDelimited => {
                let Ok(len) = decode_varint(&mut buf) else {
                    return false;
                };
                let Some(payload) = usize::try_from(len).ok().and_then(|l| buf.get(..l)) else {
                    return false;
                };
                buf = &buf[payload.len()..];
                if let Some(&(_, child, singular)) =
                    shape.children.iter().find(|(n, _, _)| *n == number)
                {
                    // Unknown fields may hide in any message below.
                    if singular && seen & bit != 0 {
                        return false;
                    }
                    if !walk(shapes, child, payload, depth + 1) {
                        return false;
                    }
                }
            }
            WireType::StartGroup | WireType::EndGroup => return false,
        }
        seen |= bit;
    }
    seen & shape.required == shape.required
}
