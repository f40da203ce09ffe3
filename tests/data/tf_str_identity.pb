
,
sPlaceholder*
dtype0*
shape:

tIdentitys*
T0"µ	