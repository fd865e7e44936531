import subprocess, sys
cases = [
 "B=1;Hq=2;Hk=1;N=128;D=128;kw=dict(pingpong=True,stages=2)",
 "B=1;Hq=2;Hk=1;N=128;D=128;kw=dict(pingpong=True,stages=3)",
 "B=1;Hq=2;Hk=1;N=128;D=128;kw=dict(pingpong=True,stages=3,persistent=False)",
 "B=1;Hq=2;Hk=1;N=128;D=128;kw=dict(pipeline=True,stages=3)",
 "B=1;Hq=2;Hk=1;N=1024;D=128;kw=dict(pingpong=True,stages=3)",
 "B=4;Hq=32;Hk=32;N=4096;D=128;kw=dict(pingpong=True,stages=3)",
 "B=4;Hq=32;Hk=32;N=4096;D=64;kw=dict(pingpong=True,stages=2)",
]
body = """
import torch
from course_utils.hopper.gluon_fwd import attention_gluon
from course_utils.attention import naive_attention
{c}
g=torch.Generator(device='cuda').manual_seed(0)
q=torch.randn(B,Hq,N,D,device='cuda',dtype=torch.bfloat16,generator=g)
k=torch.randn(B,Hk,N,D,device='cuda',dtype=torch.bfloat16,generator=g)
v=torch.randn(B,Hk,N,D,device='cuda',dtype=torch.bfloat16,generator=g)
for causal in (False, True):
    o=attention_gluon(q,k,v,is_causal=causal,enable_gqa=True,**kw); torch.cuda.synchronize()
    if B==1:
        r=naive_attention(q.float(),k.float(),v.float(),is_causal=causal,enable_gqa=True)
        print('err', causal, float((o.float()-r).abs().max()))
print('ok')
"""
for c in cases:
    try:
        r = subprocess.run([sys.executable, "-c", body.format(c=c)], capture_output=True, text=True, timeout=60)
        print(c, "->", r.stdout.replace("\n", " | ")[-200:], r.stderr[-300:] if r.returncode else "")
    except subprocess.TimeoutExpired:
        print(c, "-> HANG (60 s)")
    sys.stdout.flush()
