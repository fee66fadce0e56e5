#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
// usage: ins SCHEMA_VARIANT N  ; variant bits: 1=11 columns, 2=records_type index, 4=upsert, 8=FK, 16=progress handler
static int ph(void*p){ return 0; }
int main(int argc,char**argv){
  int v=atoi(argv[1]); int n=atoi(argv[2]); int batch=200; int pre=argc>3?atoi(argv[3]):0;
  const char*path="/tmp/exp2/c.db";
  char b[256]; for(const char*s2[]={"","-wal","-shm"},**q=s2;q<s2+3;q++){snprintf(b,256,"%s%s",path,*q);unlink(b);}
  sqlite3*db; sqlite3_open(path,&db);
  sqlite3_exec(db,"PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",0,0,0);
  if(v&8) sqlite3_exec(db,"PRAGMA foreign_keys=ON",0,0,0);
  sqlite3_exec(db,"CREATE TABLE zones(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO zones(id,name) VALUES(1,'a'),(2,'b'),(3,'c'),(4,'d');",0,0,0);
  char sch[2000];
  snprintf(sch,2000,"CREATE TABLE records(zone_id INTEGER NOT NULL %s, name TEXT NOT NULL, record_type TEXT NOT NULL,"
   "frame BLOB NOT NULL, %s seq INTEGER NOT NULL %s, PRIMARY KEY(zone_id,name)) WITHOUT ROWID;"
   "CREATE UNIQUE INDEX records_log ON records(zone_id, seq); %s",
   (v&8)?"REFERENCES zones(id)":"", (v&1)?"deleted INTEGER NOT NULL,":"",
   (v&1)?", created_ms INTEGER NOT NULL, created_by TEXT NOT NULL, modified_ms INTEGER NOT NULL, modified_by TEXT NOT NULL, parent_name TEXT":"",
   (v&2)?"CREATE INDEX records_type ON records(zone_id, record_type, name);":"");
  char*err=0; if(sqlite3_exec(db,sch,0,0,&err)){printf("%s\n",err);return 1;}
  if(v&16) sqlite3_progress_handler(db,1000,ph,0);
  sqlite3_stmt*st; char sql[2000];
  if(v&1) snprintf(sql,2000,"INSERT INTO records(zone_id,name,record_type,frame,deleted,seq,created_ms,created_by,modified_ms,modified_by,parent_name) VALUES(?,?,'Item',?,0,?,1700000000000,'_6f0e9c3a2b1d4e5f',1700000000000,'_6f0e9c3a2b1d4e5f',NULL)%s",
    (v&4)?" ON CONFLICT(zone_id,name) DO UPDATE SET record_type=excluded.record_type, frame=excluded.frame, deleted=excluded.deleted, seq=excluded.seq, created_ms=excluded.created_ms, created_by=excluded.created_by, modified_ms=excluded.modified_ms, modified_by=excluded.modified_by, parent_name=excluded.parent_name":"");
  else snprintf(sql,2000,"INSERT INTO records(zone_id,name,record_type,frame,seq) VALUES(?,?,'Item',?,?)%s",
    (v&4)?" ON CONFLICT(zone_id,name) DO UPDATE SET record_type=excluded.record_type, frame=excluded.frame, seq=excluded.seq":"");
  if(sqlite3_prepare_v2(db,sql,-1,&st,0)){printf("prep %s\n",sqlite3_errmsg(db));return 1;}
  unsigned char frame[247]; srand(7); for(int i=0;i<247;i++)frame[i]=rand();
  long seqs[5]={0};
  double tins=0,tcom=0,t=now();
  for(int b0=0;b0<n;b0+=batch){
    double a=now();
    sqlite3_exec(db,"BEGIN IMMEDIATE",0,0,0);
    int z=1+(b0/batch)%4;
    for(int i=b0;i<b0+batch;i++){
      long s=++seqs[z];
      char name[40]; snprintf(name,40,"c%d-r%08d",z,i);
      sqlite3_reset(st); sqlite3_bind_int64(st,1,z); sqlite3_bind_text(st,2,name,-1,SQLITE_TRANSIENT);
      sqlite3_bind_blob(st,3,frame,247,SQLITE_TRANSIENT); sqlite3_bind_int64(st,4,s);
      if(sqlite3_step(st)!=SQLITE_DONE){printf("step %s\n",sqlite3_errmsg(db));return 1;}
    }
    double m=now(); tins+=m-a;
    sqlite3_exec(db,"COMMIT",0,0,0);
    tcom+=now()-m;
  }
  double w=now()-t;
  printf("variant %2d: %7.0f rows/s  insert %.2f us/row  commit %.0f us/tx\n",v,n/w,tins*1e6/n,tcom*1e6/(n/batch));
}
