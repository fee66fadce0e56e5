import sqlite3, os, random, sys
def run(schema, label, commits=100, zones=4, batch=200, user='_'+'a'*32):
    global USER; USER=user
    path=f'/tmp/wal/{label}.db'
    for s in ['', '-wal', '-shm']:
        try: os.remove(path+s)
        except FileNotFoundError: pass
    db=sqlite3.connect(path, isolation_level=None)
    db.execute('PRAGMA journal_mode=WAL'); db.execute('PRAGMA synchronous=FULL'); db.execute('PRAGMA wal_autocheckpoint=0')
    db.executescript(schema)
    rnd=random.Random(1)
    frames_before=0
    seqs=[0]*zones
    total=0
    def walframes():
        try: return max(0, (os.path.getsize(path+"-wal")-32)//(4096+24))
        except FileNotFoundError: return 0
    counts=[]
    pages=[]
    for c in range(commits):
        z=c%zones
        db.execute('BEGIN IMMEDIATE')
        for i in range(batch):
            seqs[z]+=1
            name='c%d-%08d-%s' % (z, seqs[z], 'x'*12)
            db.execute('INSERT INTO records(zone_id,name,record_type,frame,deleted,seq,created_ms,created_by,modified_ms,modified_by) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(zone_id,name) DO UPDATE SET frame=excluded.frame',
                (z+1, name, 'Item', rnd.randbytes(269), 0, seqs[z], 1, USER, 1, USER))
        before=walframes()
        db.execute('COMMIT')
        after=walframes()
        # with autocheckpoint off, WAL grows; frames appended by this commit:
        counts.append(after-before)
        if c>=100 and c<140:
            with open(path+'-wal','rb') as f:
                for k in range(before, after):
                    f.seek(32+k*(4096+24)); pg=int.from_bytes(f.read(4),'big'); pages.append(pg)
        if c % 20 == 19:
            db.execute('PRAGMA wal_checkpoint(TRUNCATE)')
    n=len(counts[20:])
    print(label, 'frames/commit (after warmup):', sum(counts[20:])/n)
    m={}
    for name,pageno in db.execute("select name,pageno from dbstat"): m[pageno]=name
    from collections import Counter
    cnt=Counter(m.get(p,'?') for p in pages)
    print('   per commit by btree:', {k: round(v/40,1) for k,v in cnt.items()})
    for row in db.execute("select name, count(*), sum(pagetype='internal') from dbstat group by name order by 2 desc limit 6"): print('   ', row)
H='''CREATE TABLE records(zone_id INTEGER NOT NULL, name TEXT NOT NULL, record_type TEXT NOT NULL, frame BLOB NOT NULL, deleted INTEGER NOT NULL, seq INTEGER NOT NULL, created_ms INTEGER NOT NULL, created_by TEXT NOT NULL, modified_ms INTEGER NOT NULL, modified_by TEXT NOT NULL, parent_name TEXT, PRIMARY KEY(zone_id, name)) WITHOUT ROWID;
CREATE UNIQUE INDEX records_log ON records(zone_id, seq);
CREATE INDEX records_type ON records(zone_id, record_type, name);'''
R='''CREATE TABLE records(zone_id INTEGER NOT NULL, name TEXT NOT NULL, record_type TEXT NOT NULL, frame BLOB NOT NULL, deleted INTEGER NOT NULL, seq INTEGER NOT NULL, created_ms INTEGER NOT NULL, created_by TEXT NOT NULL, modified_ms INTEGER NOT NULL, modified_by TEXT NOT NULL, parent_name TEXT);
CREATE UNIQUE INDEX records_name ON records(zone_id, name);
CREATE UNIQUE INDEX records_log ON records(zone_id, seq);
CREATE INDEX records_type ON records(zone_id, record_type, name);'''
run(H,'H',commits=int(sys.argv[1])); run(R,'R',commits=int(sys.argv[1])); run(R,'R-intusers',commits=int(sys.argv[1]),user=7); run(H,'H-intusers',commits=int(sys.argv[1]),user=7)
