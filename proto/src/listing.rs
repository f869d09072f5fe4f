//! `ListNodesResponse`, written by hand rather than generated, so that a
//! server can send nodes it encoded before: at 4,096 nodes, building and
//! encoding every node's brief view took 4-8 ms of each `gpuctl nodes`, and
//! up to 50 ms while a big job's ranks kept both cores busy. On the wire it
//! is the message `gpuctl.proto` declares; a client decodes it as usual.

use prost::bytes::{Buf, BufMut, BytesMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::pb::Node;

/// `repeated Node nodes = 1`.
const NODES: u32 = 1;

#[derive(Clone, PartialEq, Default, Debug)]
pub struct ListNodesResponse {
    pub nodes: Vec<Node>,
    /// More nodes, already framed as `nodes` entries ([`Self::push_encoded`]),
    /// sent after `nodes`. Always empty in a decoded message.
    pub encoded: BytesMut,
}

impl ListNodesResponse {
    /// Adds a node from its encoding, `node`, merged with `patch`: the
    /// fields of `patch` that are set replace those of `node` (protobuf's
    /// rule for a message encoded twice), so a cached encoding can go out
    /// with a fresher heartbeat.
    pub fn push_encoded(&mut self, node: &[u8], patch: &Node) {
        let len = node.len() + patch.encoded_len();
        encoding::encode_key(NODES, WireType::LengthDelimited, &mut self.encoded);
        encoding::encode_varint(len as u64, &mut self.encoded);
        self.encoded.put_slice(node);
        patch.encode_raw(&mut self.encoded);
    }
}

impl Message for ListNodesResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for n in &self.nodes {
            encoding::message::encode(NODES, n, buf);
        }
        buf.put_slice(&self.encoded);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            NODES => encoding::message::merge_repeated(wire_type, &mut self.nodes, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(NODES, &self.nodes) + self.encoded.len()
    }

    fn clear(&mut self) {
        self.nodes.clear();
        self.encoded.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{GpuInfo, NodeState};

    fn node(name: &str, heard: u64) -> Node {
        Node {
            name: name.into(),
            gpus: vec![GpuInfo {
                index: 0,
                name: "NVIDIA H200".into(),
                ..Default::default()
            }],
            state: NodeState::Ready as i32,
            last_heartbeat_unix_ms: heard,
            current_job: "job-000001".into(),
            slots: 8,
            ..Default::default()
        }
    }

    #[test]
    fn encoded_nodes_decode_as_nodes_with_the_patch_applied() {
        let mut resp = ListNodesResponse {
            nodes: vec![node("a", 5)],
            ..Default::default()
        };
        // Cached without a heartbeat, sent with a fresh one.
        let cached = node("b", 0).encode_to_vec();
        resp.push_encoded(
            &cached,
            &Node {
                last_heartbeat_unix_ms: 99,
                ..Default::default()
            },
        );
        resp.push_encoded(&node("c", 7).encode_to_vec(), &Node::default());
        let bytes = resp.encode_to_vec();
        assert_eq!(bytes.len(), resp.encoded_len());
        let back = ListNodesResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.nodes, vec![node("a", 5), node("b", 99), node("c", 7)]);
        assert!(back.encoded.is_empty());
    }

    #[test]
    fn it_is_the_declared_message_on_the_wire() {
        // A client built from the .proto alone (any other language) reads
        // the same bytes: a repeated field 1 of `Node`s and nothing else.
        let resp = ListNodesResponse {
            nodes: vec![node("a", 1), node("b", 2)],
            ..Default::default()
        };
        let mut expected = Vec::new();
        for n in &resp.nodes {
            expected.push(0x0a); // field 1, length-delimited
            expected.push(n.encoded_len() as u8);
            n.encode_raw(&mut expected);
        }
        assert_eq!(resp.encode_to_vec(), expected);
    }
}
