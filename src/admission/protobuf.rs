//! A minimal reader of the protobuf wire format, enough to walk ONNX `ModelProto` and TensorFlow `GraphDef`
//! messages without their schemas. It never allocates more than the input holds and never panics: a
//! malformed message is an `Err` (the backend would refuse it too).
//!
//! It accepts everything protobuf's own parser accepts, so that "this reader cannot parse it" implies "the
//! backend cannot load it": groups (wire types 3/4), which no ONNX or TensorFlow field uses but protobuf
//! still parses and keeps as unknown fields, are skipped rather than refused.

/// One field of a message: its number and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: a nested message, a string, bytes or a packed repeated field.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

/// Iterates over the fields of one message (not nested ones).
pub struct Fields<'a> {
    buf: &'a [u8],
    failed: bool,
}

/// The fields of `buf`. Iteration yields `Err` once, at the first malformed field, then stops.
pub fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, failed: false }
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if buf.len() < n {
        return None;
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Some(head)
}

/// Protobuf's default recursion limit (`CodedInputStream::GetDefaultRecursionLimit`): it refuses groups nested
/// deeper, so stopping there accepts everything it accepts and bounds the recursion.
const MAX_GROUP_DEPTH: u32 = 100;

/// A field number (> 0) and a wire type.
fn key(buf: &mut &[u8]) -> Option<(u32, u64)> {
    // Protobuf reads a key as 32 bits and drops the rest (`ReadTag`: `uint32_t` arithmetic over at most 5
    // bytes): a key of 5 bytes with bits above 31 set is the field the low 32 bits name, so a reader that kept
    // them would see another field than the backend does.
    let key = varint(buf)? as u32;
    let number = Some(key >> 3).filter(|&n| n > 0)?;
    Some((number, u64::from(key & 7)))
}

/// Skips the body of group `number` up to its matching end-group key (nested groups included).
fn skip_group(buf: &mut &[u8], number: u32, depth: u32) -> Option<()> {
    if depth >= MAX_GROUP_DEPTH {
        return None;
    }
    loop {
        let (n, wire) = key(buf)?;
        match wire {
            3 => skip_group(buf, n, depth + 1)?,
            4 => return (n == number).then_some(()),
            _ => {
                value(buf, wire)?;
            }
        }
    }
}

/// The value of a field of wire type 0, 1, 2 or 5.
fn value<'a>(buf: &mut &'a [u8], wire: u64) -> Option<Value<'a>> {
    Some(match wire {
        0 => Value::Varint(varint(buf)?),
        1 => Value::Fixed64(u64::from_le_bytes(take(buf, 8)?.try_into().ok()?)),
        2 => {
            let len = usize::try_from(varint(buf)?).ok()?;
            Value::Bytes(take(buf, len)?)
        }
        5 => Value::Fixed32(u32::from_le_bytes(take(buf, 4)?.try_into().ok()?)),
        _ => return None, // 6, 7 do not exist; 4 (end group) outside a group fails in protobuf too
    })
}

impl<'a> Fields<'a> {
    /// The next field; `Some(None)` for a group, which was skipped.
    fn next_field(&mut self) -> Option<Option<(u32, Value<'a>)>> {
        let (number, wire) = key(&mut self.buf)?;
        if wire == 3 {
            skip_group(&mut self.buf, number, 0)?;
            return Some(None);
        }
        Some(Some((number, value(&mut self.buf, wire)?)))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed || self.buf.is_empty() {
                return None;
            }
            match self.next_field() {
                Some(Some(f)) => return Some(Ok(f)),
                Some(None) => continue,
                None => {
                    self.failed = true;
                    return Some(Err("malformed protobuf message".to_string()));
                }
            }
        }
    }
}

impl<'a> Value<'a> {
    /// The payload of a length-delimited field (message, string, bytes), or `None` for another wire type.
    pub fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    pub fn varint(self) -> Option<u64> {
        match self {
            Value::Varint(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_wire_type() {
        // 1: varint 150; 2: bytes "hi"; 3: fixed32 7; 4: fixed64 9
        let msg = [0x08, 0x96, 0x01, 0x12, 2, b'h', b'i', 0x1d, 7, 0, 0, 0, 0x21, 9, 0, 0, 0, 0, 0, 0, 0];
        let got: Vec<_> = fields(&msg).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            got,
            vec![(1, Value::Varint(150)), (2, Value::Bytes(b"hi")), (3, Value::Fixed32(7)), (4, Value::Fixed64(9))]
        );
    }

    #[test]
    fn groups_are_skipped_as_protobuf_does() {
        // 1: varint 1; group 2 { 3: varint 5; group 4 { } }; 5: bytes "x"
        let msg = [0x08, 1, 0x13, 0x18, 5, 0x23, 0x24, 0x14, 0x2a, 1, b'x'];
        let got: Vec<_> = fields(&msg).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, vec![(1, Value::Varint(1)), (5, Value::Bytes(b"x"))]);
        // a group that is the last field
        assert_eq!(fields(&[0x13, 0x14]).count(), 0);
        // unterminated, mismatched end, end group without a start, nesting past the limit: errors
        let deep: Vec<u8> = std::iter::repeat_n(0x13, 200).chain(std::iter::repeat_n(0x14, 200)).collect();
        for bad in [&[0x13, 0x08, 1][..], &[0x13, 0x1c][..], &[0x14][..], &deep[..]] {
            let got: Vec<_> = fields(bad).collect();
            assert_eq!(got.len(), 1, "{bad:?}");
            assert!(got[0].is_err());
        }
    }

    #[test]
    fn keys_are_read_as_32_bits_like_protobuf() {
        // field 1 (bytes "x") and an empty group 2, keys written in 5 bytes with bit 32 set: protobuf reads
        // fields 1 and 2 (and matches the group's end); a reader keeping bit 32 would see field 2^29 + 1
        let msg = [0x8a, 0x80, 0x80, 0x80, 0x10, 1, b'x', 0x93, 0x80, 0x80, 0x80, 0x10, 0x14];
        let got: Vec<_> = fields(&msg).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, vec![(1, Value::Bytes(b"x"))]);
    }

    #[test]
    fn malformed_input_is_one_error() {
        for bad in [&[0x12, 5, b'a'][..], &[0x08][..], &[0x0b][..], &[0x00, 0x01][..], &[0xff; 11][..]] {
            let got: Vec<_> = fields(bad).collect();
            assert_eq!(got.len(), 1, "{bad:?}");
            assert!(got[0].is_err());
        }
    }
}
