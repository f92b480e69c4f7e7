//! The sealed form of a cluster's etcd snapshot: what a control-plane agent
//! writes while it reads the snapshot from its etcd member, and what a
//! restore opens. Sans-IO: bytes in, bytes out.
//!
//! The snapshot is encrypted on the machine, before it leaves it, with the
//! cluster's snapshot key (one per cluster, kept sealed by the coordinator
//! and handed to the machine in the directive), so neither the
//! coordinator's disk nor a bucket ever holds it in the clear.
//!
//! Layout: the magic `DRVSNAP1`, the header's length (u32, big endian), the
//! header (JSON: cluster, cluster UID, snapshot name, chunk size, nonce
//! prefix), then the chunks. Each chunk is AES-256-GCM over `chunkSize`
//! bytes of the snapshot (the last one over what is left, possibly none)
//! and its tag. This is the STREAM construction (Hoang, Reyhanitabar,
//! Rogaway, Vizár, "Online Authenticated-Encryption and its Nonce-Reuse
//! Misuse-Resistance", 2015): the nonce is a random prefix, the chunk's
//! counter and a flag set on the last chunk only, and every chunk carries
//! the whole header as associated data. So a reordered, dropped, altered or
//! cut-short chunk fails to open, a cut at a chunk boundary is told from
//! the end, and a snapshot cannot pass for another cluster's (its UID is in
//! the header every tag covers).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first bytes of a sealed snapshot.
pub const MAGIC: &[u8; 8] = b"DRVSNAP1";

/// Bytes of the snapshot each chunk seals (the last may be shorter).
pub const CHUNK_SIZE: usize = 64 * 1024;

/// The tag each chunk carries.
const TAG_LEN: usize = 16;

/// The largest header a reader accepts.
const MAX_HEADER: usize = 4096;

/// Why a sealed snapshot does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a sealed Drover etcd snapshot (it does not start with {:?})", std::str::from_utf8(MAGIC).unwrap_or_default())]
    NotASnapshot,
    #[error("the snapshot's header is unreadable: {0}")]
    Header(String),
    #[error("the snapshot key is not 32 bytes of base64")]
    BadKey,
    #[error("chunk {chunk} of snapshot {snapshot} does not open with cluster {cluster}'s snapshot key: the file is corrupt or was altered, or the key is another cluster's")]
    Tampered {
        snapshot: String,
        cluster: String,
        chunk: u32,
    },
    #[error("snapshot {snapshot} is cut short after {chunks} chunks: its last chunk is missing (an interrupted upload or a truncated file)")]
    Truncated { snapshot: String, chunks: u32 },
    #[error("snapshot {0} has more than 2^32 chunks")]
    TooLong(String),
}

/// A cluster's snapshot key: 32 random bytes. Its `Debug` hides the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct SnapshotKey([u8; 32]);

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

impl SnapshotKey {
    /// A new random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system RNG works");
        Self(bytes)
    }

    /// The key as a directive carries it.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    pub fn from_base64(text: &str) -> Result<Self, SnapshotError> {
        let bytes = STANDARD.decode(text).map_err(|_| SnapshotError::BadKey)?;
        Ok(Self(bytes.try_into().map_err(|_| SnapshotError::BadKey)?))
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte AES-256 key"))
    }
}

/// What a sealed snapshot says of itself, in the clear (and covered by
/// every chunk's tag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotHeader {
    pub cluster: String,
    pub cluster_uid: String,
    pub snapshot: String,
    pub chunk_size: u32,
    /// Hexadecimal, 7 bytes: the random part of every chunk's nonce.
    pub nonce_prefix: String,
}

/// What sealing or opening saw of the snapshot itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest256 {
    /// The snapshot's length in bytes (unsealed).
    pub size: u64,
    /// SHA-256 of the unsealed snapshot, hexadecimal.
    pub sha256: String,
}

/// What sealing and opening share: the key, the associated data (the whole
/// header), the nonce prefix, the number of the next chunk, and the size
/// and hash of the snapshot's bytes so far.
struct Chunks {
    key: LessSafeKey,
    aad: Vec<u8>,
    prefix: [u8; 7],
    counter: u32,
    hash: Sha256,
    size: u64,
    snapshot: String,
}

impl Chunks {
    fn new(key: &SnapshotKey, aad: Vec<u8>, prefix: [u8; 7], snapshot: &str) -> Self {
        Self {
            key: key.aead(),
            aad,
            prefix,
            counter: 0,
            hash: Sha256::new(),
            size: 0,
            snapshot: snapshot.to_owned(),
        }
    }

    /// The nonce of the next chunk: the prefix, its number, and whether it
    /// is the last.
    fn nonce(&self, last: bool) -> Nonce {
        let mut n = [0u8; 12];
        n[..7].copy_from_slice(&self.prefix);
        n[7..11].copy_from_slice(&self.counter.to_be_bytes());
        n[11] = u8::from(last);
        Nonce::assume_unique_for_key(n)
    }

    /// Counts `plain`, bytes of the snapshot.
    fn count(&mut self, plain: &[u8]) {
        self.hash.update(plain);
        self.size += plain.len() as u64;
    }

    /// Moves on to the next chunk.
    fn advance(&mut self) -> Result<(), SnapshotError> {
        self.counter = self
            .counter
            .checked_add(1)
            .ok_or_else(|| SnapshotError::TooLong(self.snapshot.clone()))?;
        Ok(())
    }

    fn digest(self) -> Digest256 {
        Digest256 {
            size: self.size,
            sha256: hex::encode(self.hash.finalize()),
        }
    }
}

/// Seals a snapshot as it is read: feed it in pieces of any size, take the
/// sealed bytes as they come.
pub struct Sealer {
    chunks: Chunks,
    pending: Vec<u8>,
}

impl Sealer {
    /// A sealer for snapshot `snapshot` of cluster `cluster` (UID
    /// `cluster_uid`), and the sealed file's first bytes (magic and header).
    pub fn new(
        key: &SnapshotKey,
        cluster: &str,
        cluster_uid: &str,
        snapshot: &str,
    ) -> (Self, Vec<u8>) {
        let mut prefix = [0u8; 7];
        SystemRandom::new()
            .fill(&mut prefix)
            .expect("the system RNG works");
        let header = SnapshotHeader {
            cluster: cluster.to_owned(),
            cluster_uid: cluster_uid.to_owned(),
            snapshot: snapshot.to_owned(),
            chunk_size: CHUNK_SIZE as u32,
            nonce_prefix: hex::encode(prefix),
        };
        let json = serde_json::to_vec(&header).expect("a header serialises");
        let mut head = MAGIC.to_vec();
        head.extend_from_slice(&(json.len() as u32).to_be_bytes());
        head.extend_from_slice(&json);
        let sealer = Self {
            chunks: Chunks::new(key, head.clone(), prefix, snapshot),
            pending: Vec::with_capacity(CHUNK_SIZE),
        };
        (sealer, head)
    }

    fn seal_chunk(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        let c = &mut self.chunks;
        let tag = c
            .key
            .seal_in_place_separate_tag(c.nonce(last), Aad::from(&c.aad), &mut self.pending)
            .expect("AES-GCM seals any chunk this size");
        out.extend_from_slice(&self.pending);
        out.extend_from_slice(tag.as_ref());
        self.pending.clear();
        c.advance()
    }

    /// Seals `data`, the snapshot's next bytes, appending to `out` every
    /// chunk that is known not to be the last.
    pub fn update(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        self.chunks.count(data);
        while !data.is_empty() {
            // A full chunk is sealed only once a byte after it arrives: until
            // then it may be the last.
            if self.pending.len() == CHUNK_SIZE {
                self.seal_chunk(false, out)?;
            }
            let take = (CHUNK_SIZE - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(())
    }

    /// Seals what is left as the last chunk; the snapshot's size and hash.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<Digest256, SnapshotError> {
        self.seal_chunk(true, out)?;
        Ok(self.chunks.digest())
    }
}

/// Reads a sealed snapshot's header from its first bytes: the header and
/// how many bytes it took, or `None` while more bytes are needed.
pub fn read_header(bytes: &[u8]) -> Result<Option<(SnapshotHeader, usize)>, SnapshotError> {
    let magic_len = MAGIC.len();
    if bytes.len() < magic_len {
        return if MAGIC.starts_with(bytes) {
            Ok(None)
        } else {
            Err(SnapshotError::NotASnapshot)
        };
    }
    if &bytes[..magic_len] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let Some(len) = bytes.get(magic_len..magic_len + 4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    if len > MAX_HEADER {
        return Err(SnapshotError::Header(format!(
            "it claims {len} bytes, more than the {MAX_HEADER} a header may have"
        )));
    }
    let end = magic_len + 4 + len;
    let Some(json) = bytes.get(magic_len + 4..end) else {
        return Ok(None);
    };
    let header: SnapshotHeader =
        serde_json::from_slice(json).map_err(|e| SnapshotError::Header(e.to_string()))?;
    if header.chunk_size == 0 || header.chunk_size as usize > 16 * CHUNK_SIZE {
        return Err(SnapshotError::Header(format!(
            "chunk size {} is out of range",
            header.chunk_size
        )));
    }
    Ok(Some((header, end)))
}

/// Opens a sealed snapshot as it is read, after its header.
pub struct Opener {
    chunks: Chunks,
    /// A sealed chunk's length (all but the last).
    chunk: usize,
    pending: Vec<u8>,
    header: SnapshotHeader,
}

impl Opener {
    /// An opener for the snapshot whose first `head` bytes (magic and
    /// header, as [`read_header`] measured them) are given.
    pub fn new(key: &SnapshotKey, head: &[u8]) -> Result<Self, SnapshotError> {
        let (header, used) = read_header(head)?
            .ok_or_else(|| SnapshotError::Header("the header is cut short".into()))?;
        let prefix: [u8; 7] = hex::decode(&header.nonce_prefix)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| SnapshotError::Header("the nonce prefix is not 7 bytes".into()))?;
        Ok(Self {
            chunks: Chunks::new(key, head[..used].to_vec(), prefix, &header.snapshot),
            chunk: header.chunk_size as usize + TAG_LEN,
            pending: Vec::new(),
            header,
        })
    }

    /// What the snapshot's header says.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    fn open_chunk(
        &mut self,
        len: usize,
        last: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), SnapshotError> {
        let mut sealed: Vec<u8> = self.pending.drain(..len).collect();
        let c = &mut self.chunks;
        let plain = c
            .key
            .open_in_place(c.nonce(last), Aad::from(&c.aad), &mut sealed)
            .map_err(|_| SnapshotError::Tampered {
                snapshot: self.header.snapshot.clone(),
                cluster: self.header.cluster.clone(),
                chunk: c.counter,
            })?;
        out.extend_from_slice(plain);
        c.count(plain);
        c.advance()
    }

    /// Opens the sealed bytes `data`, appending to `out` the snapshot bytes
    /// of every chunk known not to be the last.
    pub fn update(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        self.pending.extend_from_slice(data);
        while self.pending.len() > self.chunk {
            self.open_chunk(self.chunk, false, out)?;
        }
        Ok(())
    }

    /// Opens what is left as the last chunk; the snapshot's size and hash.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<Digest256, SnapshotError> {
        if self.pending.len() < TAG_LEN {
            return Err(SnapshotError::Truncated {
                snapshot: self.header.snapshot.clone(),
                chunks: self.chunks.counter,
            });
        }
        let len = self.pending.len();
        self.open_chunk(len, true, out).map_err(|e| match e {
            // A full-size chunk that does not open as the last one is most
            // likely a file cut at a chunk boundary.
            SnapshotError::Tampered { .. } if len == self.chunk => SnapshotError::Truncated {
                snapshot: self.header.snapshot.clone(),
                chunks: self.chunks.counter,
            },
            e => e,
        })?;
        Ok(self.chunks.digest())
    }
}

/// Opens a whole sealed snapshot held in memory: its header, its bytes and
/// their size and hash.
pub fn open_all(
    key: &SnapshotKey,
    sealed: &[u8],
) -> Result<(SnapshotHeader, Vec<u8>, Digest256), SnapshotError> {
    let (_, used) = read_header(sealed)?
        .ok_or_else(|| SnapshotError::Header("the header is cut short".into()))?;
    let mut opener = Opener::new(key, &sealed[..used])?;
    let mut out = Vec::with_capacity(sealed.len());
    opener.update(&sealed[used..], &mut out)?;
    let header = opener.header().clone();
    let digest = opener.finish(&mut out)?;
    Ok((header, out, digest))
}

/// The SHA-256 etcd appends to every snapshot it streams (its
/// `Maintenance.Snapshot` sends the database, then the hash of it; `etcdutl
/// snapshot restore` refuses a file whose last 32 bytes are not the hash of
/// the rest, unless told to skip the check). Fed the snapshot as it is
/// opened, it tells whether the file is a whole etcd snapshot.
#[derive(Default)]
pub struct EtcdHash {
    hash: Sha256,
    /// The last (up to) 32 bytes seen: the hash, once all is seen.
    tail: Vec<u8>,
}

/// The length of etcd's trailing hash.
const ETCD_HASH_LEN: usize = 32;

impl EtcdHash {
    pub fn update(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        if self.tail.len() > ETCD_HASH_LEN {
            let hashed = self.tail.len() - ETCD_HASH_LEN;
            self.hash.update(&self.tail[..hashed]);
            self.tail.drain(..hashed);
        }
    }

    /// Whether the bytes fed end with the SHA-256 of the bytes before.
    pub fn matches(self) -> bool {
        self.tail.len() == ETCD_HASH_LEN && self.hash.finalize().as_slice() == self.tail.as_slice()
    }
}

/// Why a sealed snapshot file cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum OpenFileError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("it is snapshot {found}, not {wanted}")]
    OtherSnapshot { found: String, wanted: String },
    #[error("it was taken of another cluster (UID {found}, not {wanted})")]
    OtherCluster { found: String, wanted: String },
    #[error("its contents do not end with the SHA-256 etcd appends to every snapshot: it is not a whole etcd snapshot")]
    NotEtcd,
}

/// Opens the sealed snapshot `reader` holds, as it reads it, writing the
/// snapshot to `out`; checks that it is snapshot `name` of the cluster
/// with UID `cluster_uid` and ends with etcd's own hash. Returns its size
/// and SHA-256.
pub fn open_stream(
    key: &SnapshotKey,
    name: &str,
    cluster_uid: &str,
    reader: &mut impl std::io::Read,
    out: &mut impl std::io::Write,
) -> Result<Digest256, OpenFileError> {
    let mut buf = vec![0u8; CHUNK_SIZE];
    let mut head = Vec::new();
    let used = loop {
        if let Some((_, used)) = read_header(&head)? {
            break used;
        }
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Err(SnapshotError::Header("the header is cut short".into()).into());
        }
        head.extend_from_slice(&buf[..n]);
    };
    let mut opener = Opener::new(key, &head[..used])?;
    let header = opener.header().clone();
    if header.snapshot != name {
        return Err(OpenFileError::OtherSnapshot {
            found: header.snapshot,
            wanted: name.to_owned(),
        });
    }
    if header.cluster_uid != cluster_uid {
        return Err(OpenFileError::OtherCluster {
            found: header.cluster_uid,
            wanted: cluster_uid.to_owned(),
        });
    }
    let mut etcd = EtcdHash::default();
    let mut plain = Vec::with_capacity(2 * CHUNK_SIZE);
    let mut feed = |opener: &mut Opener, data: &[u8], plain: &mut Vec<u8>| {
        opener.update(data, plain)?;
        etcd.update(plain);
        out.write_all(plain)?;
        plain.clear();
        Ok::<(), OpenFileError>(())
    };
    feed(&mut opener, &head[used..], &mut plain)?;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        feed(&mut opener, &buf[..n], &mut plain)?;
    }
    let digest = opener.finish(&mut plain)?;
    etcd.update(&plain);
    out.write_all(&plain)?;
    if !etcd.matches() {
        return Err(OpenFileError::NotEtcd);
    }
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(key: &SnapshotKey, data: &[u8], pieces: usize) -> (Vec<u8>, Digest256) {
        let (mut s, mut out) = Sealer::new(key, "prod", "uid-1", "prod-20261128t000000z");
        for piece in data.chunks(pieces.max(1)) {
            s.update(piece, &mut out).unwrap();
        }
        let d = s.finish(&mut out).unwrap();
        (out, d)
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn every_length_round_trips_whatever_the_pieces() {
        let key = SnapshotKey::generate();
        for len in [
            0,
            1,
            CHUNK_SIZE - 1,
            CHUNK_SIZE,
            CHUNK_SIZE + 1,
            3 * CHUNK_SIZE,
        ] {
            let data = sample(len);
            for pieces in [1000, 32 * 1024, CHUNK_SIZE, 5 * CHUNK_SIZE] {
                let (sealed, d) = seal(&key, &data, pieces);
                let (header, plain, opened) = open_all(&key, &sealed).unwrap();
                assert_eq!(plain, data, "length {len}, pieces of {pieces}");
                assert_eq!(d, opened);
                assert_eq!(d.size, len as u64);
                assert_eq!(d.sha256, hex::encode(Sha256::digest(&data)));
                assert_eq!(header.cluster_uid, "uid-1");
                // Opening in odd pieces gives the same.
                let (_, used) = read_header(&sealed).unwrap().unwrap();
                let mut o = Opener::new(&key, &sealed[..used]).unwrap();
                let mut out = vec![];
                for piece in sealed[used..].chunks(7777) {
                    o.update(piece, &mut out).unwrap();
                }
                o.finish(&mut out).unwrap();
                assert_eq!(out, data);
            }
        }
    }

    #[test]
    fn a_cut_altered_or_foreign_snapshot_does_not_open() {
        let key = SnapshotKey::generate();
        let data = sample(2 * CHUNK_SIZE + 100);
        let (sealed, _) = seal(&key, &data, 4096);
        let (_, used) = read_header(&sealed).unwrap().unwrap();
        let chunk = CHUNK_SIZE + TAG_LEN;

        // Cut inside the last chunk, and exactly at a chunk boundary.
        for cut in [sealed.len() - 1, used + 2 * chunk, used + chunk, used + 5] {
            let err = open_all(&key, &sealed[..cut]).unwrap_err();
            assert!(
                matches!(
                    err,
                    SnapshotError::Truncated { .. } | SnapshotError::Tampered { .. }
                ),
                "cut at {cut}: {err}"
            );
        }
        let boundary = open_all(&key, &sealed[..used + 2 * chunk]).unwrap_err();
        assert!(
            matches!(boundary, SnapshotError::Truncated { chunks: 1, .. }),
            "{boundary}"
        );

        // One flipped bit in a chunk, and in the header.
        let mut bad = sealed.clone();
        bad[used + chunk + 10] ^= 1;
        assert!(matches!(
            open_all(&key, &bad).unwrap_err(),
            SnapshotError::Tampered { chunk: 1, .. }
        ));
        let mut relabelled = sealed.clone();
        let at = used - 3;
        relabelled[at] = if relabelled[at] == b'a' { b'b' } else { b'a' };
        let err = open_all(&key, &relabelled).unwrap_err();
        assert!(
            matches!(
                err,
                SnapshotError::Tampered { chunk: 0, .. } | SnapshotError::Header(_)
            ),
            "{err}"
        );

        // Another cluster's key.
        let err = open_all(&SnapshotKey::generate(), &sealed).unwrap_err();
        assert!(err.to_string().contains("another cluster's"), "{err}");

        // Not a snapshot at all, and a header that claims too much.
        assert_eq!(
            open_all(&key, b"{\"etcd\": 1}").unwrap_err(),
            SnapshotError::NotASnapshot
        );
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            read_header(&huge).unwrap_err(),
            SnapshotError::Header(_)
        ));
        assert_eq!(read_header(b"DRV").unwrap(), None);
    }

    #[test]
    fn the_key_travels_as_base64_and_hides_in_logs() {
        let key = SnapshotKey::generate();
        assert_eq!(SnapshotKey::from_base64(&key.to_base64()).unwrap(), key);
        assert_eq!(format!("{key:?}"), "SnapshotKey(..)");
        assert_eq!(
            SnapshotKey::from_base64("c2hvcnQ=").unwrap_err(),
            SnapshotError::BadKey
        );
    }

    /// An etcd-like snapshot: bytes, then their SHA-256.
    fn etcd_like(len: usize) -> Vec<u8> {
        let mut data = sample(len);
        let hash = Sha256::digest(&data);
        data.extend_from_slice(&hash);
        data
    }

    #[test]
    fn a_file_opens_as_it_is_read_and_must_end_with_etcds_hash() {
        let key = SnapshotKey::generate();
        for len in [0, 10, CHUNK_SIZE - 32, CHUNK_SIZE, 3 * CHUNK_SIZE + 7] {
            let data = etcd_like(len);
            let (sealed, digest) = seal(&key, &data, 1000);
            let mut out = Vec::new();
            let got = open_stream(
                &key,
                "prod-20261128t000000z",
                "uid-1",
                &mut sealed.as_slice(),
                &mut out,
            )
            .unwrap();
            assert_eq!(got, digest, "length {len}");
            assert_eq!(out, data, "length {len}");
        }
        // Why `sealed` does not open as snapshot `name` of cluster `uid`.
        let refused = |name: &str, uid: &str, mut sealed: &[u8]| {
            open_stream(&key, name, uid, &mut sealed, &mut Vec::new()).unwrap_err()
        };
        // Not etcd's: no hash at its end.
        let (sealed, _) = seal(&key, &sample(5000), 1000);
        let err = refused("prod-20261128t000000z", "uid-1", &sealed);
        assert!(matches!(err, OpenFileError::NotEtcd), "{err}");
        // Another cluster's, another snapshot, a cut file.
        let (sealed, _) = seal(&key, &etcd_like(100), 1000);
        let err = refused("prod-20261128t000000z", "uid-2", &sealed);
        assert!(matches!(err, OpenFileError::OtherCluster { .. }), "{err}");
        let err = refused("prod-other", "uid-1", &sealed);
        assert!(matches!(err, OpenFileError::OtherSnapshot { .. }), "{err}");
        let cut = &sealed[..sealed.len() - 5];
        let err = refused("prod-20261128t000000z", "uid-1", cut);
        assert!(
            matches!(
                err,
                OpenFileError::Snapshot(
                    SnapshotError::Tampered { .. } | SnapshotError::Truncated { .. }
                )
            ),
            "{err}"
        );
    }
}
