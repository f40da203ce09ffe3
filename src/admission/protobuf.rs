//! A minimal reader of the protobuf wire format, enough to walk ONNX `ModelProto` and TensorFlow `GraphDef`
//! messages without their schemas. It never allocates more than the input holds and never panics: a
//! malformed message is an `Err` (the backend would refuse it too).

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

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Option<(u32, Value<'a>)> {
        let key = varint(&mut self.buf)?;
        let number = u32::try_from(key >> 3).ok().filter(|&n| n > 0)?;
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut self.buf)?),
            1 => Value::Fixed64(u64::from_le_bytes(take(&mut self.buf, 8)?.try_into().ok()?)),
            2 => {
                let len = usize::try_from(varint(&mut self.buf)?).ok()?;
                Value::Bytes(take(&mut self.buf, len)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(take(&mut self.buf, 4)?.try_into().ok()?)),
            _ => return None, // groups (3, 4) are not used by ONNX or TensorFlow
        };
        Some((number, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.buf.is_empty() {
            return None;
        }
        match self.next_field() {
            Some(f) => Some(Ok(f)),
            None => {
                self.failed = true;
                Some(Err("malformed protobuf message".to_string()))
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
    fn malformed_input_is_one_error() {
        for bad in [&[0x12, 5, b'a'][..], &[0x08][..], &[0x0b][..], &[0x00, 0x01][..], &[0xff; 11][..]] {
            let got: Vec<_> = fields(bad).collect();
            assert_eq!(got.len(), 1, "{bad:?}");
            assert!(got[0].is_err());
        }
    }
}
