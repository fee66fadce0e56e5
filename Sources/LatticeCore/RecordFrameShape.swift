/// The size of a record's state that bounds the work of a write, read from a validated frame without
/// decoding it: the server refuses a state above its limits before joining it, as `records/modify`
/// checks the same on JSON.
public struct RecordFrameShape: Hashable, Sendable {
    /// Fields of the record.
    public let fieldCount: Int
    /// Elements (set entries, a list's visible elements) of its largest set or list field; 0 when it has none.
    public let largestListCount: Int
    /// Replicas in the largest causal context of its set, list and text fields; 0 when it has none. A context costs a
    /// join work as its entries do, so the server bounds both (JSON counts a context as an array too).
    public let largestContextCount: Int

    public init(fieldCount: Int, largestListCount: Int, largestContextCount: Int) {
        self.fieldCount = fieldCount
        self.largestListCount = largestListCount
        self.largestContextCount = largestContextCount
    }
}

extension RecordFrame {
    /// Counts the fields, the largest list's entries and the largest context's replicas by walking the frame's field headers (the frame was
    /// validated when it was made, so the reads are unchecked).
    public var shape: RecordFrameShape {
        withFrame { frame in
            let header = FrameHeader(frame)
            var cursor = ByteCursor(frame, at: header.fieldsStart)
            var largest = 0, largestContext = 0
            for _ in 0..<header.fieldCount {
                _ = cursor.string()
                let kind = cursor.u8()
                let length = Int(cursor.varint())
                let payload = cursor.offset
                if kind == 1 { // set: context vector, then the entry count
                    var set = ByteCursor(frame, at: payload)
                    let replicas = set.varint()
                    largestContext = max(largestContext, Int(replicas))
                    for _ in 0..<replicas {
                        _ = set.varint()
                        set.offset += 8
                    }
                    largest = max(largest, Int(set.varint()))
                } else if kind == 2 || kind == 3 { // list or text: its context, and a list's visible elements
                    var sequence = ByteCursor(frame, at: payload)
                    largestContext = max(largestContext, Int(sequence.varint()))
                    sequence.offset = payload
                    let visible = SequenceCodecLayout.skipToValues(&sequence)
                    if kind == 2 { largest = max(largest, visible) }
                }
                cursor.offset = payload + length
            }
            return RecordFrameShape(fieldCount: header.fieldCount, largestListCount: largest,
                                    largestContextCount: largestContext)
        }
    }
}
