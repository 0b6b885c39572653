from roofline.cli import app

app(prog_name="roofline")
