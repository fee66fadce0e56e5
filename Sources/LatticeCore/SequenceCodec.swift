/// What a sequence holds, and how its values are written in the binary codec.
protocol SequenceElement: Hashable, Sendable {
    /// Writes the visible values in document order.
    static func writeValues(_ values: [Self], into writer: inout BinaryWriter)
    /// Reads exactly `count` values.
    static func readValues(count: Int, from reader: inout BinaryReader) throws(CodecError) -> [Self]
}

extension Unicode.Scalar: SequenceElement {
    /// A text's values: their UTF-8 bytes, preceded by the byte count.
    static func writeValues(_ values: [Unicode.Scalar], into writer: inout BinaryWriter) {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(values.count)
        appendUTF8(values, to: &bytes)
        writer.varint(UInt64(bytes.count))
        writer.append(bytes)
    }

    /// Appends the UTF-8 of `scalars` (ASCII a byte at a time, without the encoder).
    static func appendUTF8<S: Sequence>(_ scalars: S, to bytes: inout [UInt8]) where S.Element == Unicode.Scalar {
        for scalar in scalars {
            if scalar.value < 0x80 { bytes.append(UInt8(scalar.value)) } else { UTF8.encode(scalar) { bytes.append($0) } }
        }
    }

    static func readValues(count: Int, from reader: inout BinaryReader) throws(CodecError) -> [Unicode.Scalar] {
        let length = try reader.count(minimumElementSize: 1, "text bytes")
        guard length >= count && length <= count * 4 else {
            throw reader.fail(.malformed, "text (\(length) bytes cannot hold \(count) characters)")
        }
        let bytes = UnsafeRawBufferPointer(rebasing: reader.buffer[reader.offset..<(reader.offset + length)])
        if length == count {
            // ASCII (one byte per character, which UTF-8 allows only for ASCII): no decoding.
            guard BinaryReader.isASCII(bytes) else { throw reader.fail(.malformed, "text (not UTF-8)") }
            reader.offset += length
            return bytes.map { Unicode.Scalar($0) }
        }
        var scalars: [Unicode.Scalar] = []
        scalars.reserveCapacity(count)
        var decoder = UTF8()
        var iterator = bytes.makeIterator()
        decoding: while true {
            switch decoder.decode(&iterator) {
            case .scalarValue(let scalar): scalars.append(scalar)
            case .emptyInput: break decoding
            case .error: throw reader.fail(.malformed, "text (not UTF-8)")
            }
        }
        guard scalars.count == count else {
            throw reader.fail(.malformed, "text (\(scalars.count) characters where the runs hold \(count))")
        }
        reader.offset += length
        return scalars
    }
}

extension ScalarValue: SequenceElement {
    /// A list's values, one after another.
    static func writeValues(_ values: [ScalarValue], into writer: inout BinaryWriter) {
        for value in values { writer.value(value) }
    }

    static func readValues(count: Int, from reader: inout BinaryReader) throws(CodecError) -> [ScalarValue] {
        guard count <= reader.remaining else { throw reader.fail(.truncated, "list values") }
        var values: [ScalarValue] = []
        values.reserveCapacity(count)
        for _ in 0..<count {
            guard let value = try reader.value() else { throw reader.fail(.malformed, "list value (nil)") }
            values.append(value)
        }
        return values
    }
}

/// The binary form of a sequence (a field payload):
/// ```
/// sequence = context:vv replicaCount:varint replica:u64* runCount:varint run* values
/// run      = replicaIndex:varint counter:varint length:varint flags:u8 [parentReplicaIndex:varint parentCounter:varint]
///            flags: bit 0 deleted; bits 1-2 the parent: 0 none (the start), 1 the element before in the same
///            replica (counter - 1), 2 written out
/// values   = the visible elements' values in document order (text: byteCount:varint utf8)
/// ```
/// Canonical: replicas strictly ascending and each used; runs in document order, merged where one continues
/// another; a written-out parent is never the element before in the same replica. The decoder checks all
/// of it (rebuilding the order from the tree), so `encode(decode(bytes)) == bytes`.
extension SequenceState where Element: SequenceElement {
    func encode(into writer: inout BinaryWriter) {
        Self.write(context: context, runs: runs, values: elements, into: &writer)
    }

    /// Writes the binary form of a state given by its parts (not checked: the decoder checks).
    static func write(context: VersionVector, runs: [SequenceRun], values: [Element], into writer: inout BinaryWriter) {
        writer.versionVector(context)
        let replicas = Array(Set(runs.map(\.id.replica.rawValue)).union(runs.compactMap { $0.parent?.replica.rawValue })).sorted()
        var index: [UInt64: Int] = [:]
        for (position, replica) in replicas.enumerated() { index[replica] = position }
        writer.varint(UInt64(replicas.count))
        for replica in replicas { writer.u64(replica) }
        writer.varint(UInt64(runs.count))
        for run in runs {
            writer.varint(UInt64(index[run.id.replica.rawValue]!))
            writer.varint(run.id.counter)
            writer.varint(UInt64(run.length))
            var flags: UInt8 = run.deleted ? 1 : 0
            if let parent = run.parent {
                if parent.replica == run.id.replica && parent.counter &+ 1 == run.id.counter {
                    flags |= 2
                    writer.u8(flags)
                } else {
                    flags |= 4
                    writer.u8(flags)
                    writer.varint(UInt64(index[parent.replica.rawValue]!))
                    writer.varint(parent.counter)
                }
            } else {
                writer.u8(flags)
            }
        }
        Element.writeValues(values, into: &writer)
    }

    /// A state from its parts (a field's JSON form), checked exactly as its binary form is.
    init(context: VersionVector, runs: [SequenceRun], values: [Element]) throws(CodecError) {
        var writer = BinaryWriter(capacity: 64 + runs.count * 8 + values.count * 2)
        Self.write(context: context, runs: runs, values: values, into: &writer)
        try self.init(validating: writer.finish())
    }

    func encodedBytes() -> [UInt8] {
        var writer = BinaryWriter(capacity: 64 + count * 2)
        encode(into: &writer)
        return writer.finish()
    }

    /// Reads and checks a canonical sequence.
    init(decoding reader: inout BinaryReader) throws(CodecError) {
        let context = try reader.versionVector()
        let replicaCount = try reader.count(minimumElementSize: 8, "sequence replicas")
        var replicas: [ReplicaID] = []
        replicas.reserveCapacity(replicaCount)
        for _ in 0..<replicaCount {
            let replica = ReplicaID(try reader.u64("sequence replica"))
            if let last = replicas.last, last >= replica { throw reader.fail(.malformed, "sequence replicas (not ascending)") }
            replicas.append(replica)
        }
        var used = [Bool](repeating: false, count: replicaCount)
        func replica(_ reader: inout BinaryReader) throws(CodecError) -> ReplicaID {
            let position = try reader.varint("sequence replica index")
            guard position < UInt64(replicaCount) else { throw reader.fail(.malformed, "sequence replica index") }
            used[Int(position)] = true
            return replicas[Int(position)]
        }
        let runCount = try reader.count(minimumElementSize: 4, "sequence runs")
        var pieces: [Piece] = []
        pieces.reserveCapacity(runCount)
        var visible = 0
        for _ in 0..<runCount {
            let owner = try replica(&reader)
            let counter = try reader.varint("sequence counter")
            let length = try reader.varint("sequence run length")
            guard counter >= 1, length >= 1, length <= Self.maximumCounter, counter <= Self.maximumCounter - length + 1 else {
                throw reader.fail(.malformed, "sequence run (counter \(counter), length \(length))")
            }
            let flags = try reader.u8("sequence run flags")
            guard flags & ~7 == 0 else { throw reader.fail(.malformed, "sequence run flags") }
            let id = SequenceID(counter: counter, replica: owner)
            var parent: SequenceID?
            switch flags >> 1 {
            case 0: parent = nil
            case 1:
                guard counter > 1 else { throw reader.fail(.malformed, "sequence run (no element before the first)") }
                parent = SequenceID(counter: counter - 1, replica: owner)
            case 2:
                let parentReplica = try replica(&reader)
                let parentCounter = try reader.varint("sequence parent counter")
                let written = SequenceID(counter: parentCounter, replica: parentReplica)
                guard parentCounter >= 1, written < id, !(parentReplica == owner && parentCounter + 1 == counter) else {
                    throw reader.fail(.malformed, "sequence run parent")
                }
                parent = written
            default:
                throw reader.fail(.malformed, "sequence run flags")
            }
            let deleted = flags & 1 != 0
            let run = SequenceRun(id: id, length: Int(length), parent: parent, deleted: deleted)
            if let last = pieces.last?.run, last.isContinued(by: run) {
                throw reader.fail(.malformed, "sequence runs (one continues the one before: not merged)")
            }
            pieces.append(Piece(run: run, start: deleted ? -1 : visible))
            if !deleted { visible += Int(length) }
        }
        guard used.allSatisfy({ $0 }) else { throw reader.fail(.malformed, "sequence replicas (one is unused)") }
        // Each replica's inserts recorded their stamps in the context: a state whose context misses a writer
        // would never travel in a delta (Zone.changes(since:) looks at the context only).
        for replica in replicas where context[replica] == .zero {
            throw reader.fail(.malformed, "sequence context (replica \(replica) wrote runs but is not in it)")
        }
        guard visible <= reader.remaining else {
            throw reader.fail(.truncated, "sequence values (\(visible) values cannot fit in \(reader.remaining) bytes)")
        }
        let values = try Element.readValues(count: visible, from: &reader)
        // No element twice, and the order is the tree's.
        var spans = pieces.map { (replica: $0.run.id.replica.rawValue, counter: $0.run.id.counter, length: UInt64($0.run.length)) }
        spans.sort { $0.replica != $1.replica ? $0.replica < $1.replica : $0.counter < $1.counter }
        for index in spans.indices.dropFirst() {
            let before = spans[index - 1], span = spans[index]
            if before.replica == span.replica && before.counter + before.length > span.counter {
                throw reader.fail(.malformed, "sequence runs (two hold one element)")
            }
        }
        guard SequenceJoin<Element>.isTreeOrder(pieces) else {
            throw reader.fail(.malformed, "sequence (runs out of order, or a parent is missing)")
        }
        self.init(ordered: pieces, values: values, context: context)
    }

    init(validating bytes: [UInt8]) throws(CodecError) {
        do {
            self = try bytes.withUnsafeBytes { raw throws(CodecError) in
                var reader = BinaryReader(raw)
                let state = try SequenceState(decoding: &reader)
                try reader.end()
                return state
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "sequence", offset: 0)
        }
    }
}

/// A text that merges character by character: a sequence of Unicode scalars.
public typealias TextState = SequenceState<Unicode.Scalar>
/// An ordered list that keeps duplicates.
public typealias ListState = SequenceState<ScalarValue>

extension SequenceState where Element == Unicode.Scalar {
    /// The binary form (see `SequenceState.encode(into:)`).
    public func encoded() -> [UInt8] { encodedBytes() }
    /// Reads a canonical binary form, or throws saying what is wrong.
    public init(decoding bytes: [UInt8]) throws(CodecError) { try self.init(validating: bytes) }
    /// The visible text.
    public var text: String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        for chunk in chunks {
            for piece in chunk.pieces where !piece.run.deleted {
                Unicode.Scalar.appendUTF8(values[piece.start..<(piece.start + piece.run.length)], to: &bytes)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

extension SequenceState where Element == ScalarValue {
    /// The binary form (see `SequenceState.encode(into:)`).
    public func encoded() -> [UInt8] { encodedBytes() }
    /// Reads a canonical binary form, or throws saying what is wrong.
    public init(decoding bytes: [UInt8]) throws(CodecError) { try self.init(validating: bytes) }
}

/// Reads of a validated sequence payload without decoding it (frame walks).
enum SequenceCodecLayout {
    /// Moves `cursor` from the start of a sequence payload past its context, replicas and runs, to its
    /// values; returns how many visible elements those values are.
    static func skipToValues(_ cursor: inout ByteCursor) -> Int {
        for _ in 0..<cursor.varint() { // the context
            _ = cursor.varint()
            cursor.offset += 8
        }
        cursor.offset += 8 * Int(cursor.varint()) // the replicas
        var visible = 0
        for _ in 0..<cursor.varint() {
            _ = cursor.varint()
            _ = cursor.varint()
            let length = Int(cursor.varint())
            let flags = cursor.u8()
            if flags >> 1 == 2 {
                _ = cursor.varint()
                _ = cursor.varint()
            }
            if flags & 1 == 0 { visible += length }
        }
        return visible
    }
}
