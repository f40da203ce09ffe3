//! Devices: `CPU`, `GPU`, `CPU:<n>`, `GPU:<n>`. Each distinct device string (case-insensitive) has its own queue.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// As the client wrote it; MODELGET and AI.INFO give it back unchanged.
    pub name: String,
    pub kind: DeviceKind,
    pub id: Option<u32>,
    /// The name of this device's queue: the device string, upper-cased (made once: every run looks it up).
    queue: std::sync::Arc<str>,
}

impl Device {
    /// RedisAI's MODELSTORE rule: `CPU`/`GPU` with an optional `:<digits>`, fewer than 10 characters.
    pub fn parse(s: &[u8]) -> Result<Device> {
        let text = std::str::from_utf8(s).map_err(|_| Error::InvalidDevice)?;
        if text.len() >= 10 || !text.is_ascii() {
            return Err(Error::InvalidDevice);
        }
        // ASCII only from here, so byte offsets are character boundaries.
        let (head, rest) = text.split_at(text.len().min(3));
        let kind = match head {
            k if k.eq_ignore_ascii_case("CPU") => DeviceKind::Cpu,
            k if k.eq_ignore_ascii_case("GPU") => DeviceKind::Gpu,
            _ => return Err(Error::InvalidDevice),
        };
        let id = match rest {
            "" => None,
            rest => {
                let digits = rest.strip_prefix(':').ok_or(Error::InvalidDevice)?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Error::InvalidDevice);
                }
                Some(digits.parse().map_err(|_| Error::InvalidDevice)?)
            }
        };
        Ok(Device { name: text.to_string(), kind, id, queue: text.to_ascii_uppercase().into() })
    }

    /// The CPU queue that TENSORSET/TENSORGET ops of a DAG run on.
    pub fn cpu() -> Device {
        Device { name: "CPU".into(), kind: DeviceKind::Cpu, id: None, queue: "CPU".into() }
    }

    /// The name of this device's queue: the device string, upper-cased.
    pub fn queue_key(&self) -> std::sync::Arc<str> {
        self.queue.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_redisai() {
        let d = Device::parse(b"cpu:1").unwrap();
        assert_eq!((d.kind, d.id, d.queue_key(), d.name.as_str()), (DeviceKind::Cpu, Some(1), "CPU:1".into(), "cpu:1"));
        assert_eq!(Device::parse(b"GPU").unwrap().kind, DeviceKind::Gpu);
        assert_eq!(Device::parse(b"CPU:12345").unwrap().id, Some(12345));
        for bad in [
            &b"bad_device"[..],
            b"CPU::",
            b"CPU:1.8",
            b"CPU:",
            b"CPU:123456",
            b"TPU",
            b"CPUX",
            b"",
            "é1".as_bytes(),
            "CPU:é".as_bytes(),
        ] {
            assert_eq!(Device::parse(bad), Err(Error::InvalidDevice), "{bad:?}");
        }
    }
}
